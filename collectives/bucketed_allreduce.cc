#include "collectives/bucketed_allreduce.h"

#include <algorithm>

#include "common/check.h"
#include "common/time.h"

namespace pwm::collectives {

BucketedAllreduce::BucketedAllreduce(Communicator* comm, std::vector<Range> units, size_t bucket_bytes,
                                     bool overlap, OnBucketDone on_done)
    : comm_(comm), overlap_(overlap), on_done_(std::move(on_done)), units_(std::move(units)) {
  for (size_t u = 1; u < units_.size(); ++u)
    PWM_CHECK(units_[u].second <= units_[u - 1].first, "units must run from the buffer's end backwards");
  if (comm_ == nullptr || comm_->size() == 1) return;
  for (const Cut& c : cut(units_, bucket_bytes)) buckets_.push_back({c.begin, c.end, c.last_unit, {}});
}

BucketedAllreduce::Sizes BucketedAllreduce::auto_sizes(int64_t total_elements) {
  // A quarter of the buffer per bucket: the part left for after the backward is at most about a
  // quarter (the last bucket's), while the per-bucket cost (a few messages each) stays small.
  // The 256-bucket limit binds only beyond 6 GiB of gradient: then 1/255 of it per bucket
  // (whole floats), so that the first bucket plus the others stay within 256.
  constexpr int64_t F = sizeof(float);
  const int64_t total = std::max<int64_t>(1, total_elements) * F;
  constexpr int64_t kFirst = 1 << 20, kMax = 25 << 20, kMin = 1024;
  int64_t rest = std::max({std::min((total + 3) / 4, kMax), kMin, (total + 254) / 255});
  rest = (rest + F - 1) / F * F;
  return {static_cast<size_t>(std::min(kFirst, rest)), static_cast<size_t>(rest)};
}

std::vector<BucketedAllreduce::Cut> BucketedAllreduce::cut(const std::vector<Range>& units, size_t bucket_bytes) {
  Sizes sz{bucket_bytes, bucket_bytes};
  if (bucket_bytes == kAutoBuckets) {
    int64_t total = 0;
    for (const auto& [lo, hi] : units) total += hi - lo;
    sz = auto_sizes(total);
  }
  auto cap_of = [](size_t bytes) { return std::max<int64_t>(1, static_cast<int64_t>(bytes / sizeof(float))); };
  // Walk the units from the end of the buffer towards its start, closing a bucket whenever it
  // reaches its cap, or where the next unit is not adjacent (a bucket is one contiguous range);
  // a unit larger than a bucket is split into several.
  std::vector<Cut> out;
  int64_t cap = cap_of(sz.first);
  int64_t open_end = -1, open_begin = -1;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const auto [lo, hi] = units[static_cast<size_t>(u)];
    if (open_end >= 0 && hi != open_begin) {  // a gap: the open bucket ends at the last unit
      out.push_back({open_begin, open_end, u - 1});
      open_end = -1;
      cap = cap_of(sz.rest);
    }
    for (int64_t pos = hi; pos > lo;) {
      if (open_end < 0) open_end = pos;
      const int64_t take = std::min(pos - lo, cap - (open_end - pos));
      pos -= take;
      open_begin = pos;
      if (open_end - open_begin >= cap) {
        out.push_back({open_begin, open_end, u});
        open_end = -1;
        cap = cap_of(sz.rest);
      }
    }
  }
  if (open_end >= 0) out.push_back({open_begin, open_end, static_cast<int>(units.size()) - 1});
  return out;
}

std::vector<BucketedAllreduce::Part> BucketedAllreduce::parts(const std::vector<Cut>& cuts,
                                                              const std::vector<Range>& ranges) {
  std::vector<Part> out;
  int64_t at = 0;
  for (const auto& [lo, hi] : ranges) {
    std::vector<Part> here;
    for (const Cut& c : cuts) {
      const int64_t b = std::max(lo, c.begin), e = std::min(hi, c.end);
      if (b < e) here.push_back({at + (b - lo), e - b, c.end - c.begin, b - c.begin});
    }
    std::sort(here.begin(), here.end(), [](const Part& x, const Part& y) { return x.at < y.at; });
    out.insert(out.end(), here.begin(), here.end());
    at += hi - lo;
  }
  return out;
}

namespace {
bool trivial(const Communicator* c) { return c == nullptr || c->size() == 1; }
}  // namespace

BucketedAllreduce::BucketedAllreduce(Communicator* inner, Communicator* inner_gather, Communicator* outer,
                                     std::vector<Range> units, size_t bucket_bytes, bool overlap, OnBucketDone on_done)
    : BucketedAllreduce(trivial(inner) ? outer : inner, std::move(units), bucket_bytes, overlap, std::move(on_done)) {
  if (trivial(inner) || trivial(outer)) return;  // one level: the flat AllReduce set up above
  PWM_CHECK(inner_gather != nullptr && inner_gather->group() == inner->group() &&
                inner_gather->context() != inner->context(),
            "hierarchical allreduce: the gather communicator must be the inner group on another context");
  // Each stage's collectives start in bucket order, possibly from poll(): a communicator's 257th
  // collective in flight would block there on the oldest (communicator.h), which may wait for
  // this rank's progress on another stage: a deadlock. So every bucket must fit in the window.
  if (buckets_.size() > 256)
    PWM_THROW("hierarchical allreduce: {} buckets of {} bytes; at most 256: use larger buckets (--bucket-bytes {} or "
              "more)", buckets_.size(), bucket_bytes, (units_.front().second - units_.back().first) * sizeof(float) / 256 + 1);
  outer_ = outer;
  gather_ = inner_gather;
  // Scratch for every bucket at once (buckets are in flight together): bucket i uses
  // [padded offset, + size * s) and its shard [shard offset, + s), s = ceil(n / size).
  const int64_t D = comm_->size();
  int64_t padded = 0;
  for (Bucket& b : buckets_) {
    b.pad_off = padded;
    padded += (b.end - b.begin + D - 1) / D * D;
  }
  padded_.assign(static_cast<size_t>(padded), 0.0f);
  shard_.assign(static_cast<size_t>(padded / D), 0.0f);
}

void BucketedAllreduce::begin(float* buffer) {
  buf_ = buffer;
  units_done_ = 0;
  comm_s_ = 0;
  outer_next_ = gather_next_ = 0;
  for (auto& b : buckets_) {
    b.started = b.done = b.ready = false;
    b.work = Work();
  }
}

void BucketedAllreduce::start(Bucket& b) {
  b.started = true;
  b.start_us = now_us();
  if (outer_ != nullptr) {
    b.stage = 0;
    const int64_t D = comm_->size(), n = b.end - b.begin, s = (n + D - 1) / D;
    float* pad = padded_.data() + b.pad_off;
    std::copy(buf_ + b.begin, buf_ + b.end, pad);
    std::fill(pad + n, pad + D * s, 0.0f);
    b.work = comm_->ireduce_scatter(pad, shard_.data() + b.pad_off / D, static_cast<size_t>(s), DataType::kFloat32,
                                    ReduceOp::kSum);
    return;
  }
  b.work = comm_->iallreduce(buf_ + b.begin, buf_ + b.begin, static_cast<size_t>(b.end - b.begin),
                             DataType::kFloat32, ReduceOp::kSum, Algorithm::kAuto);
}

bool BucketedAllreduce::advance(size_t i) {
  Bucket& b = buckets_[i];
  if (outer_ == nullptr) {
    completed(i);
    return true;
  }
  // Every rank must post a communicator's collectives in the same order, but stages finish in
  // an order that depends on timing: so each stage's collectives are started in bucket order (a
  // bucket whose turn has not come waits, b.ready), and the all-gathers use their own
  // communicator (inner_gather), not interleaving with the reduce-scatters.
  const int64_t D = comm_->size(), n = b.end - b.begin, s = (n + D - 1) / D;
  float* pad = padded_.data() + b.pad_off;
  float* shard = shard_.data() + b.pad_off / D;
  if (b.stage == 0) {  // the inner sum of this rank's shard is here: add the other groups' (same shard)
    if (static_cast<int>(i) != outer_next_) return false;
    ++outer_next_;
    b.work = outer_->iallreduce(shard, shard, static_cast<size_t>(s), DataType::kFloat32, ReduceOp::kSum);
  } else if (b.stage == 1) {  // every shard complete: gather the bucket inside the group
    if (static_cast<int>(i) != gather_next_) return false;
    ++gather_next_;
    b.work = gather_->iallgather(shard, pad, static_cast<size_t>(s), DataType::kFloat32);
  } else {
    std::copy(pad, pad + n, buf_ + b.begin);
    completed(i);
    return true;
  }
  ++b.stage;
  b.ready = false;
  return true;
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
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      if (!b.started || b.done) continue;
      if (!b.ready) b.ready = b.work.test();
      if (b.ready && advance(i)) moved = true;
    }
  }
  comm_s_ += now_s() - t0;
}

void BucketedAllreduce::finish() {
  if (buckets_.empty()) return;
  const double t0 = now_s();
  for (auto& b : buckets_)
    if (!b.started) start(b);
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    while (!b.done) {  // every earlier bucket is done: this one's turn has come at every stage
      if (!b.ready) {
        b.work.wait();
        b.ready = true;
      }
      PWM_CHECK(advance(i), "bucket {} could not advance", i);
    }
  }
  comm_s_ += now_s() - t0;
}

}  // namespace pwm::collectives
