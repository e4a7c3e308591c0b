#include "spmd/grad_reducer.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/time.h"

namespace pwm::spmd {

using collectives::Algorithm;
using collectives::DataType;
using collectives::ReduceOp;

GradReducer::GradReducer(collectives::Communicator* dp_comm, const model::ParamLayout& layout,
                         size_t bucket_bytes, bool overlap, Trace* trace)
    : comm_(dp_comm), overlap_(overlap), trace_(trace),
      num_layers_(static_cast<int>(layout.config().n_layers)) {
  // Units in backward order and their element ranges (each contiguous in the buffer).
  const int64_t C = layout.config().d_model;
  unit_ranges_.push_back({layout.final_norm_offset(), layout.final_norm_offset() + C});
  for (int l = num_layers_ - 1; l >= 0; --l) unit_ranges_.push_back({layout.layer(l).begin, layout.layer(l).end});
  const auto& embed = layout.get("embed");
  unit_ranges_.push_back({embed.offset, embed.offset + embed.size});
  if (comm_ == nullptr || comm_->size() == 1) return;  // nothing to reduce
  // Walk the units from the end of the buffer towards its start, closing a bucket whenever it
  // reaches bucket_bytes; a unit larger than a bucket is split into several.
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  int64_t open_end = -1, open_begin = -1;
  for (int u = 0; u < num_units(); ++u) {
    auto [lo, hi] = unit_ranges_[u];
    int64_t pos = hi;
    if (open_end >= 0) PWM_CHECK_EQ(open_begin, hi);  // units are adjacent, in reverse order
    while (pos > lo) {
      if (open_end < 0) open_end = pos;
      const int64_t take = std::min(pos - lo, cap - (open_end - pos));
      pos -= take;
      open_begin = pos;
      if (open_end - open_begin >= cap) {
        buckets_.push_back({open_begin, open_end, u, {}});
        open_end = -1;
      }
    }
  }
  if (open_end >= 0) buckets_.push_back({open_begin, open_end, num_units() - 1, {}});
}

void GradReducer::begin(float* grads) {
  grads_ = grads;
  units_done_ = 0;
  comm_s_ = 0;
  for (auto& b : buckets_) {
    b.started = b.done = false;
    b.work = collectives::Work();
  }
}

void GradReducer::start(Bucket& b) {
  b.work = comm_->iallreduce(grads_ + b.begin, grads_ + b.begin, static_cast<size_t>(b.end - b.begin),
                             DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto);
  b.started = true;
  b.start_us = now_us();
}

void GradReducer::unit_done(int unit) {
  units_done_ = std::max(units_done_, unit + 1);
  if (!overlap_) return;
  for (auto& b : buckets_)
    if (!b.started && b.last_unit < units_done_) start(b);
  poll();
}

void GradReducer::poll() {
  if (buckets_.empty()) return;
  const double t0 = now_s();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.started && !b.done && b.work.test()) {
      b.done = true;
      if (trace_) trace_->span(fmt::format("allreduce bucket {}", i), "comm", b.start_us, now_us(), 1,
                               fmt::format(R"({{"bytes":{}}})", (b.end - b.begin) * 4));
    }
  }
  comm_s_ += now_s() - t0;
}

void GradReducer::finish() {
  if (buckets_.empty()) return;
  const double t0 = now_s();
  for (auto& b : buckets_)
    if (!b.started) start(b);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.done) continue;
    b.work.wait();
    b.done = true;
    if (trace_) trace_->span(fmt::format("allreduce bucket {}", i), "comm", b.start_us, now_us(), 1,
                             fmt::format(R"({{"bytes":{}}})", (b.end - b.begin) * 4));
  }
  comm_s_ += now_s() - t0;
}

}  // namespace pwm::spmd
