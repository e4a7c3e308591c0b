// Bucketed, overlapped AllReduce of one contiguous float buffer that fills up in pieces
// (Horovod's fusion buffer, DDP's gradient buckets).
//
// The buffer is described as "units" (element ranges, adjacent, listed in the order they are
// finished, e.g. a model's layers in backward order). The buffer is cut into buckets walking the
// units in that order (cut() below: of about `bucket_bytes`, or, by default, sized from the
// units); a bucket is started as soon as the last unit it covers is finished (overlap on), or
// all at the end (overlap off). Progress is made in
// poll(), which the caller invokes between its compute steps: there is no progress thread (on
// a small machine it would take a core from the compute). Overlap on or off gives the same
// bits: the same sums, in the same order, only started at other times.
//
// Hierarchical form (two communicators, Horovod's hierarchical AllReduce): the sum runs over
// inner x outer. Each bucket is a ReduceScatter inside `inner` (a bucket of n elements is padded
// to a multiple of inner.size() in a scratch copy), an AllReduce of this rank's 1/inner.size()
// shard over `outer` (the ranks that hold the same shard in the other groups: replicas across
// islands), then an AllGather inside `inner` back into the buffer. The three run one after the
// other per bucket, driven by poll()/finish(); buckets still overlap each other and the compute.
// Only 1/inner.size() of the bucket crosses `outer` (the slow links).
//
// Which ranks must call: every member of `comm` (of inner and outer), the same calls in the same
// order, with the same units and bucket size.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "collectives/communicator.h"

namespace pwm::collectives {

class BucketedAllreduce {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [begin, end) in elements
  // Called when a bucket completes: (bucket index, start us, end us, bytes) - for traces.
  using OnBucketDone = std::function<void(int, int64_t, int64_t, size_t)>;

  // bucket_bytes = kAutoBuckets: sized from the units (auto_sizes).
  static constexpr size_t kAutoBuckets = 0;
  // Default sizing (PyTorch DDP's idea: a small first bucket, so that the first AllReduce starts
  // early in the backward): the first bucket at most 1 MiB, the others about a quarter of the
  // buffer, at most DDP's 25 MiB and at least 1 KiB, and never more than 256 buckets (the
  // hierarchical form's limit). A buffer smaller than one 25 MiB bucket thus still makes several
  // buckets, the first finished after the first unit(s) of the backward (docs/spmd.md).
  struct Sizes {
    size_t first, rest;  // bytes
  };
  static Sizes auto_sizes(int64_t total_elements);
  // The bucket boundaries made of `units` (listed from the buffer's end backwards): walking them
  // in that order, a bucket closes when it reaches its size (the first bucket's, then the
  // others'), a unit larger than a bucket is split. bucket_bytes > 0: every bucket that size;
  // kAutoBuckets: auto_sizes of the units' total. Pure; the simulator (sim/step.cc) uses it.
  struct Cut {
    int64_t begin, end;  // elements
    int last_unit;       // the bucket can start once this unit is finished
  };
  static std::vector<Cut> cut(const std::vector<Range>& units, size_t bucket_bytes);
  // The same sums cut otherwise: where buffer ranges `ranges` (stored back to back elsewhere, in
  // this order) fall in the buckets `cuts`, one Part per overlap of a range and a bucket, in
  // storage order; elements in no bucket are in no part. A part reduced with
  // Communicator::iallreduce_window(..., {bucket_elems, offset}) gets, element for element, the
  // bits the bucket's AllReduce gives (pathways_train's chained pieces; docs/pathways_train.md).
  struct Part {
    int64_t at, count;             // elements, in the ranges' storage
    int64_t bucket_elems, offset;  // the bucket's size, and where the part starts in it
  };
  static std::vector<Part> parts(const std::vector<Cut>& cuts, const std::vector<Range>& ranges);

  // `comm` may be null or of size 1: then nothing is reduced. `units` are listed from the
  // buffer's end towards its start (the order backward finishes them), each ending where the
  // previous one begins or before it: what lies between two units (the experts' gradients of an
  // expert-parallel trainer, reduced over another group) is left alone, and no bucket spans it.
  BucketedAllreduce(Communicator* comm, std::vector<Range> units, size_t bucket_bytes, bool overlap,
                    OnBucketDone on_done = {});
  // Hierarchical: reduce-scatter in `inner`, AllReduce of the shard in `outer`, all-gather in
  // `inner_gather` (the same group as inner on another context: the all-gathers and the
  // reduce-scatters then need not interleave in the same order on every rank). inner or outer
  // may be null or of size 1: then this is the flat AllReduce over the other.
  BucketedAllreduce(Communicator* inner, Communicator* inner_gather, Communicator* outer, std::vector<Range> units,
                    size_t bucket_bytes, bool overlap, OnBucketDone on_done = {});

  int num_units() const { return static_cast<int>(units_.size()); }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  void begin(float* buffer);   // a new round: nothing in flight
  void unit_done(int unit);    // `unit` (and every earlier one) is final; starts what it completes
  void poll();                 // progresses what is in flight; never blocks
  void finish();               // starts what is left and waits for all of it
  double comm_seconds() const { return comm_s_; }  // time inside poll()/finish() this round

 private:
  struct Bucket {
    int64_t begin, end;
    int last_unit;
    Work work;
    bool started = false, done = false;
    bool ready = false;  // the current stage's collective has completed (hierarchical: next not yet started)
    int64_t start_us = 0;
    int64_t pad_off = 0;  // hierarchical: offset of the bucket's scratch in padded_ (size * s floats)
    int stage = 0;  // hierarchical: 0 reduce-scatter, 1 outer AllReduce, 2 all-gather
  };
  void start(Bucket& b);
  // Bucket i's current collective has completed: starts its next stage if its turn has come
  // (false otherwise), or finishes it. True if something moved.
  bool advance(size_t i);
  void completed(size_t i);

  Communicator* comm_;
  Communicator* outer_ = nullptr;   // hierarchical only (comm_ is then the inner group)
  Communicator* gather_ = nullptr;  // hierarchical: the inner group's all-gathers
  int outer_next_ = 0, gather_next_ = 0;  // hierarchical: next bucket to start each stage
  std::vector<float> padded_, shard_;  // hierarchical scratch: one bucket padded, its shard
  bool overlap_;
  OnBucketDone on_done_;
  std::vector<Range> units_;
  std::vector<Bucket> buckets_;
  float* buf_ = nullptr;
  int units_done_ = 0;
  double comm_s_ = 0;
};

}  // namespace pwm::collectives
