#include "collectives/bucketed_allreduce.h"

#include <algorithm>

#include "common/check.h"
#include "common/time.h"

namespace pwm::collectives {

BucketedAllreduce::BucketedAllreduce(Communicator* comm, std::vector<Range> units, size_t bucket_bytes,
                                     bool overlap, OnBucketDone on_done)
    : comm_(comm), overlap_(overlap), on_done_(std::move(on_done)), units_(std::move(units)) {
  for (size_t u = 1; u < units_.size(); ++u)
    PWM_CHECK_EQ(units_[u].second, units_[u - 1].first);  // adjacent, from the end backwards
  if (comm_ == nullptr || comm_->size() == 1) return;
  // Walk the units from the end of the buffer towards its start, closing a bucket whenever it
  // reaches bucket_bytes; a unit larger than a bucket is split into several.
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / sizeof(float)));
  int64_t open_end = -1, open_begin = -1;
  for (int u = 0; u < num_units(); ++u) {
    const auto [lo, hi] = units_[u];
    for (int64_t pos = hi; pos > lo;) {
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

void BucketedAllreduce::begin(float* buffer) {
  buf_ = buffer;
  units_done_ = 0;
  comm_s_ = 0;
  for (auto& b : buckets_) {
    b.started = b.done = false;
    b.work = Work();
  }
}

void BucketedAllreduce::start(Bucket& b) {
  b.work = comm_->iallreduce(buf_ + b.begin, buf_ + b.begin, static_cast<size_t>(b.end - b.begin),
                             DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto);
  b.started = true;
  b.start_us = now_us();
}

void BucketedAllreduce::completed(size_t i) {
  Bucket& b = buckets_[i];
  b.done = true;
  if (on_done_) on_done_(static_cast<int>(i), b.start_us, now_us(), static_cast<size_t>(b.end - b.begin) * sizeof(float));
}

void BucketedAllreduce::unit_done(int unit) {
  units_done_ = std::max(units_done_, unit + 1);
  if (!overlap_) return;
  for (auto& b : buckets_)
    if (!b.started && b.last_unit < units_done_) start(b);
  poll();
}

void BucketedAllreduce::poll() {
  if (buckets_.empty()) return;
  const double t0 = now_s();
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].started && !buckets_[i].done && buckets_[i].work.test()) completed(i);
  comm_s_ += now_s() - t0;
}

void BucketedAllreduce::finish() {
  if (buckets_.empty()) return;
  const double t0 = now_s();
  for (auto& b : buckets_)
    if (!b.started) start(b);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].done) continue;
    buckets_[i].work.wait();
    completed(i);
  }
  comm_s_ += now_s() - t0;
}

}  // namespace pwm::collectives
