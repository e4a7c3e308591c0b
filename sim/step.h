// One training step, simulated from the step plan (model/step_plan.h) the trainers execute.
//
// Kernel time: each unit of the plan costs its FLOPs (unit_flops, counted from the model's shapes
// and the plan's gradient pieces) times the profile's measured microseconds per GFLOP of the
// forward or the backward span; the optimizer costs its parameters times the measured
// microseconds per parameter. Devices run one unit at a time, in the plan's order.
//
// SPMD (spmd_train): dp ranks run the same units; the gradient buffer is cut into buckets as
// collectives::BucketedAllreduce cuts it, walking the plan's finish_order(); with overlap a
// bucket's AllReduce (simulated by its schedule, sim/collective.h) starts when the last
// micro-batch finishes its last range, else after the backward; then the norm's scalar
// AllReduce, the update and the per-step overhead.
// Pathways trainers (pathways_train): fused = the SPMD step inside one kernel per step; chained
// and opbyop = the plan's units as nodes, then one dp AllReduce node per gradient piece and the
// update node (programs/trace.h's structure), each node paying the worker's launch cost and, for
// opbyop, the controller's call cost when that exceeds the device time it hides behind.
// The static model (mpmd_train, MpmdModel::kStatic): the same programs, fused or chained, with
// no controller process on the cores (the 2-rank contention at dp 2, not the 3-process one), no
// dispatch and no fetch: per node the executor's cost, per step its own constant (the statistics'
// allgather), both Profile::mpmd_static.
// Pipeline: stages hold layer ranges (L s / S .. L (s+1) / S), run forward_units(m, l0, l1) and
// backward_units in GPipe or 1F1B order, and pass activations and their gradients over links
// (directly between the stages' devices under both models; the static model has no controller).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "collectives/bucketed_allreduce.h"
#include "model/step_plan.h"
#include "train/config.h"
#include "sim/sim.h"

namespace pwm::sim {

struct UnitFlops {
  double fwd = 0, bwd = 0;  // FLOPs of the unit counted in the forward / backward span
};
// FLOPs of unit `u` for `seqs` sequences of model `m` (per sequence: per token x seq_len).
UnitFlops unit_flops(const model::Config& m, const model::StepPlan& plan, const model::Unit& u, int64_t seqs);
// The same summed over one micro-batch's units (forward span, backward span).
UnitFlops micro_flops(const model::Config& m, const model::StepPlan& plan, int64_t seqs);

struct StepPrediction {
  double step_us = 0;
  double compute_us = 0;        // one device's kernel time
  double exposed_comm_us = 0;   // step time not hidden behind compute (collectives, dispatch, waits)
  double bubble = 0;            // pipeline: 1 - mean busy / step
  double tokens_per_s = 0;
  int collectives = 0;          // AllReduces simulated
  int nodes = 0;                // chained / opbyop / pipeline: kernel launches per device and step
};

// `granularity`: kSpmd (spmd_train), kFused, kChained, kOpByOp (pathways_train; with
// MpmdModel::kStatic mpmd_train, fused or chained only). Devices are cluster devices 0..dp-1
// (tp must be 1). Throws pwm::Error (one line) for a combination no trainer runs, and for the
// static model with a profile that has no static costs.
StepPrediction simulate_step(const Cluster& c, const Profile& p, const train::TrainConfig& cfg,
                             ExecMode granularity, MpmdModel model = MpmdModel::kPathways);

// The MPMD pipeline of `stages` stages (stage s on device s) under "gpipe" or "1f1b", run by
// pathways_train (a controller beside the stages) or mpmd_train (the stages alone).
StepPrediction simulate_pipeline(const Cluster& c, const Profile& p, const train::TrainConfig& cfg, int stages,
                                 train::Schedule schedule, MpmdModel model = MpmdModel::kPathways);

// The pipeline's forward/backward passes alone: stage s takes dur_f[s] / dur_b[s] per
// micro-batch, runs its passes in GPipe or 1F1B order, and a pass's input sent at t by stage
// `from` arrives at arrive(from, to, t). Per stage: when it ends and how long it was busy.
struct PipelineTimes {
  std::vector<double> end, busy;
};
PipelineTimes pipeline_times(const std::vector<double>& dur_f, const std::vector<double>& dur_b, int64_t M,
                             train::Schedule schedule, const std::function<double(int, int, double)>& arrive);

// The bucket boundaries BucketedAllreduce makes of `units` (ranges listed from the buffer's end
// backwards) at `bucket_bytes` (0: its default sizing): (begin, end, last unit) per bucket, in
// start order. BucketedAllreduce::cut itself, so that the two cannot drift apart.
using BucketCut = collectives::BucketedAllreduce::Cut;
inline std::vector<BucketCut> cut_buckets(const std::vector<std::pair<int64_t, int64_t>>& units, size_t bucket_bytes) {
  return collectives::BucketedAllreduce::cut(units, bucket_bytes);
}

}  // namespace pwm::sim
