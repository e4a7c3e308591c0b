// Bucketed, overlapped gradient AllReduce over the data-parallel group (Horovod's fusion buffer
// and DDP's buckets, on the contiguous gradient buffer).
//
// The gradient buffer is cut into buckets of about `bucket_bytes`, walking the model's units in
// the order backward finishes them: final_norm, layer L-1, ..., layer 0, embed (the tied
// embedding is finished last: its lookup part comes from embed_backward). A bucket is started
// as soon as the last unit it covers is finished (overlap on), or all at the end (overlap off).
// Progress is made in poll(), which the trainer calls between layers: there is no progress
// thread (it would take a core from the compute on a small machine).
//
// Which ranks must call: every rank of the dp group, the same calls in the same order.
#pragma once

#include <vector>

#include "collectives/communicator.h"
#include "common/trace.h"
#include "model/params.h"

namespace pwm::spmd {

class GradReducer {
 public:
  GradReducer(collectives::Communicator* dp_comm, const model::ParamLayout& layout,
              size_t bucket_bytes, bool overlap, Trace* trace);

  // Units, in backward's order: 0 = final_norm, 1 + i = layer L-1-i, L + 1 = embed.
  int num_units() const { return static_cast<int>(unit_ranges_.size()); }
  int unit_of_layer(int layer) const { return 1 + (num_layers_ - 1 - layer); }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  void begin(float* grads);      // a new step: nothing in flight
  void unit_done(int unit);      // backward finished `unit`; starts the buckets it completes
  void poll();                   // progresses what is in flight (non-blocking)
  void finish();                 // starts what is left and waits for everything
  double comm_seconds() const { return comm_s_; }  // time spent inside poll()/finish() this step

 private:
  struct Bucket {
    int64_t begin, end;  // element range of the gradient buffer
    int last_unit;       // started once this unit is done
    collectives::Work work;
    bool started = false, done = false;
    int64_t start_us = 0;
  };
  void start(Bucket& b);

  collectives::Communicator* comm_;
  bool overlap_;
  Trace* trace_;
  int num_layers_;
  std::vector<std::pair<int64_t, int64_t>> unit_ranges_;
  std::vector<Bucket> buckets_;
  float* grads_ = nullptr;
  int units_done_ = 0;
  double comm_s_ = 0;
};

}  // namespace pwm::spmd
