// What the simulator's tests (tests/sim/test_sim_*.cc) share: small models, links, clusters and
// profiles whose costs are easy to compute by hand. Tolerances: the simulator adds and maxes
// doubles of a few thousand microseconds; 1e-6 us absolute is far above their rounding (~1e-12
// relative) and far below any modelling error worth catching.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/collective.h"
#include "sim/dispatch.h"
#include "sim/step.h"
#include "train/config.h"

namespace pwm::sim::testing {

inline constexpr double kTol = 1e-6;

// A link of one latency and bandwidth (us, GB/s) and a per-message overhead (us).
inline Link link(double latency_us, double gbytes_per_s, double overhead_us) {
  Link l;
  l.latency_us = latency_us, l.gbytes_per_s = gbytes_per_s, l.overhead_us = overhead_us;
  return l;
}

inline Profile zero_profile() {
  Profile p;
  p.reduce_ns_per_byte = 0;
  p.intra = p.inter = p.inter_shaped = link(0, 1e12, 0);
  return p;
}

// The dispatch tests' controller and worker costs (us): a call with one node and two worker
// messages costs 30 + 5 + 2 x 2.5 = 40, a launch 4, a fetch 11.
inline Profile dispatch_profile() {
  Profile p = zero_profile();
  p.call_us = 30, p.node_us = 5, p.msg_us = 2.5, p.exec_us = 4, p.fetch_rtt_us = 11;
  return p;
}

// Chains of 16 computations on 2 workers.
inline DispatchOptions chain16() {
  DispatchOptions o;
  o.workers = 2;
  o.chain = 16;
  return o;
}

// A small model for the step tests (2 heads of 32, d_ff 128, 32 tokens per sequence).
inline train::TrainConfig small_config(int layers, int64_t batch, int microbatches) {
  train::TrainConfig cfg;
  cfg.model.d_model = 64;
  cfg.model.n_layers = layers;
  cfg.model.n_heads = 2;
  cfg.model.head_dim = 32;
  cfg.model.d_ff = 128;
  cfg.model.seq_len = 32;
  cfg.workload.global_batch = batch;
  cfg.workload.microbatches = microbatches;
  return cfg;
}

inline Cluster one_host(int devices, Link l) {
  Cluster c;
  c.hosts = 1;
  c.devices_per_host = devices;
  c.intra = c.inter = l;
  return c;
}

inline std::vector<int> range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace pwm::sim::testing
