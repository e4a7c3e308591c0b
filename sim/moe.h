// One Mixture-of-Experts training step, simulated (docs/simulator_moe.md, "Mixture of Experts").
//
// The step is the plan's units (model/step_plan.h) on one device of the slice, as in sim/step.h,
// with an MoE layer's block costed apart (N = the tokens of one micro-batch on one dp rank, the
// routing group; E experts, top K, P = --expert-parallel, C = d_model, F = d_ff):
//   - attention, norm and router: the block's parameters without its experts, counted as a dense
//     block's (2 P forward, 4 P backward per token, plus attention);
//   - the experts: 3 F C parameters a row (gate, up, down), 6 F C FLOPs forward and 12 F C backward
//     per row, for the rows the busiest device computes (moe_rows);
//   - P > 1: the rows move by AllToAll over the expert-parallel group (devices 0..P-1): dispatch
//     and combine in the forward, their gradients in the backward, each rows x C x 4 bytes per
//     peer (simulate_alltoall); dropless layers exchange their counts first (E/P int64 per peer)
//     unless the controller routes them;
//   - --moe-routing controller: before each MoE layer's block forward, the moe_counts kernel
//     (norm and router: 2 N C E + N C FLOPs) and the controller's round trip (controller_round_trip_us),
//     during which the devices idle.
// Gradients: with P > 1 the dense ranges are summed over dp and the experts' over the dp/P ranks
// holding the same experts (SPMD: two BucketedAllreduce chains, as spmd_train; chained: one node
// per piece, its dense part then its experts, as dp_allreduce).
// Everything here is deterministic and single-threaded; nothing blocks.
#pragma once

#include <functional>
#include <map>
#include <tuple>

#include "sim/step.h"
#include "train/modes.h"

namespace pwm::sim {

// Rows of one MoE layer for one micro-batch of `tokens` tokens per dp rank.
struct MoeRows {
  double device = 0;    // rows the busiest device's experts compute: capacity E cap (padding
                        // included, cap = ceil(c K N / E)); dropless imbalance x K N
  double per_peer = 0;  // rows a device sends each peer of its group (P > 1): capacity (E/P) cap;
                        // dropless ceil(imbalance x K N / P) (every block at the busiest device's size)
};
// `imbalance`: the busiest device's rows over the mean (1 = balanced; with one expert per device,
// max/mean tokens per expert). Throws pwm::Error if it is outside [1, ep].
MoeRows moe_rows(const model::Config& m, int64_t tokens, int ep, double imbalance);

// --moe-routing controller, one MoE layer and micro-batch: the time the devices idle between the
// end of moe_counts and the start of the next segment (mpmd/segmented.h
// SegmentedStep::run). The controller fetches every device's counts (fetch_rtt_us, plus dp
// messages of E int64 on its link), puts on each device what its block_fwd reads (msg_us and 2E
// int64 per device, one after the other on its link: what Trainer::route's put sends, Shapes::
// route_counts), then dispatches the next segment (call_us + node_us x `segment_nodes` + msg_us x
// dp), whose messages arrive one controller-link latency later. Controller costs scale by the
// cluster's dispatch_scale.
double controller_round_trip_us(const Cluster& c, const Profile& p, const train::TrainConfig& cfg, int segment_nodes);

// What --what moe reports per MoE layer and micro-batch (0 where the step has none).
struct MoeLayerCosts {
  double alltoall_fwd_us = 0;   // dispatch + combine
  double alltoall_bwd_us = 0;   // their gradients
  double counts_us = 0;         // the counts AllToAll (dropless, not controller-routed)
  double moe_counts_us = 0;     // the moe_counts kernel (controller routing)
  double round_trip_us = 0;     // the controller's round trip, mean over the step's round trips
};

struct MoeStep {
  StepPrediction step;
  MoeLayerCosts layer;
  int round_trips = 0;           // controller routing: MoE layers x micro-batches
  double round_trip_total_us = 0;
  double alltoall_total_us = 0;  // every row and count AllToAll of the step
};

// Durations of collectives whose ranks enter together, by what they are (kind, group, dp, ep,
// bytes, algorithm): such a collective lasts the same wherever it starts, so each is simulated
// once. Valid for one cluster and profile: share it only between steps of the same c and p.
class CollectiveTimes {
 public:
  using Key = std::tuple<int, int, int, int, size_t, int>;
  double get(const Key& k, const std::function<double()>& simulate) {
    auto [it, fresh] = times_.try_emplace(k, 0.0);
    if (fresh) it->second = simulate();
    return it->second;
  }

 private:
  std::map<Key, double> times_;
};

struct MoeOptions {
  double imbalance = 1.0;            // see moe_rows
  CollectiveTimes* times = nullptr;  // shared between calls (--what moe: a projection's thousands of
                                     // ranks simulated once per size); null: the step's own
};

// One step of the MoE model cfg.model (which must have experts) under `mode`: kSpmd (spmd_train;
// capacity or dropless as the model says), kFused or kChained (pathways_train with
// cfg.mpmd.routing(cfg.model); fused refuses the controller routing as pathways_train does).
// Refused with one line (pwm::Error): opbyop, --replicas > 1, --tp > 1, a routing that does not
// fit the capacity.
MoeStep simulate_moe_step(const Cluster& c, const Profile& p, const train::TrainConfig& cfg, ExecMode mode,
                          const MoeOptions& o = {});

}  // namespace pwm::sim
