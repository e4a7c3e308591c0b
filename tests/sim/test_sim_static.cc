// The simulator's static model (mpmd_train, MpmdModel::kStatic) against cases computed by hand
// (docs/simulator.md, "Tests"): chained, fused and the pipeline as the Pathways steps without a
// controller, the profile's static costs, dispatch_bench's static chain.
#include <gtest/gtest.h>

#include "common/check.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "sim/collective.h"
#include "sim/dispatch.h"
#include "sim/step.h"
#include "tests/sim/sim_test_util.h"

namespace pwm::sim {
namespace {

using testing::kTol;
using testing::link;
using testing::zero_profile;
using testing::chain16;
using testing::small_config;
using testing::one_host;
using testing::range;

// Kernels at 1 and 2 GFLOP per ms, free links, two cores: two processes slow the kernels 1.5x,
// three 2x. The Pathways costs are large, so that charging any of them to the static model shows.
Profile static_profile() {
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.opt_us_per_param = 0.01, p.step_overhead_us = 7;
  p.contention = {{2, 1.5}, {3, 2.0}};
  p.call_us = 1000, p.node_us = 1000, p.msg_us = 1000, p.exec_us = 1000, p.fetch_rtt_us = 1000;
  p.step_kernel_us = 5000, p.node_step_us = 5000, p.train_node_us = 1000;
  p.mpmd_static = Profile::StaticCosts{3, 40, 0.5, 20};  // 3 us per node, 40 us per step; the chain's 0.5 and 20 us
  return p;
}

Cluster two_cores(int devices) {
  Cluster c = one_host(devices, link(0, 1e12, 0));
  c.cores_per_host = 2;
  return c;
}

// One device's kernel time of a step at dp 2 (every unit of the plan and the update), unslowed.
double step_kernels_us(const train::TrainConfig& cfg) {
  const model::ParamLayout layout(cfg.model, 0, 1);
  const model::StepPlan plan(layout, cfg.workload.microbatches);
  double k = 0.01 * static_cast<double>(layout.total());
  for (const auto& u : plan.units()) {
    const UnitFlops f = unit_flops(cfg.model, plan, u, cfg.micro_batch());
    k += f.fwd * 1e-6 + f.bwd * 2e-6;
  }
  return k;
}

// Static chained at dp 2: the units, the update and the 2-rank factor (no controller process),
// one executor cost per node (units, one AllReduce node per gradient piece, the update), the
// step's constant and the overhead; no dispatch, no fetch, none of the Pathways costs.
TEST(SimStatic, ChainedIsUnitsPlusNodeCosts) {
  train::TrainConfig cfg = small_config(2, 8, 2);
  cfg.mesh.dp = 2;
  const Profile p = static_profile();
  const model::StepPlan plan(model::ParamLayout(cfg.model, 0, 1), cfg.workload.microbatches);
  const int nodes = static_cast<int>(plan.units().size()) + plan.num_pieces() + 1;
  const StepPrediction r = simulate_step(two_cores(2), p, cfg, ExecMode::kChained, MpmdModel::kStatic);
  EXPECT_EQ(r.nodes, nodes);
  EXPECT_NEAR(r.step_us, 1.5 * step_kernels_us(cfg) + 3.0 * nodes + 40 + 7, kTol);
  // Pathways' chained step of the same plan pays its controller's share of the cores and costs.
  const StepPrediction pw = simulate_step(two_cores(2), p, cfg, ExecMode::kChained);
  EXPECT_NEAR(pw.step_us, 2.0 * step_kernels_us(cfg) + 1000.0 * 2 * nodes + 5000 + 7, kTol);
}

// Static fused: the SPMD step in one node: the kernels at the 2-rank factor, one node's cost and
// the step's constant.
TEST(SimStatic, FusedIsOneNode) {
  train::TrainConfig cfg = small_config(2, 8, 1);
  cfg.mesh.dp = 2;
  const StepPrediction r = simulate_step(two_cores(2), static_profile(), cfg, ExecMode::kFused, MpmdModel::kStatic);
  EXPECT_NEAR(r.step_us, 1.5 * step_kernels_us(cfg) + 3 + 40 + 7, kTol);
}

// The static pipeline is pipeline_times with each pass's units at the 2-rank factor plus the
// executor's cost per unit, then the updates, the overhead and the static step's constant: by
// hand for S = 2, M = 4, 1F1B. And it is Pathways' pipeline with the controller's costs taken
// away: equal when the 3-process factor is the 2-rank one and the costs are the same.
TEST(SimStatic, PipelineIsPipelineTimesWithoutAController) {
  train::TrainConfig cfg = small_config(2, 8, 4);
  const int S = 2;
  const int64_t M = 4, seqs = cfg.micro_batch();
  Profile p = static_profile();
  p.microbatch_overhead_us = 5;
  const model::ParamLayout layout(cfg.model, 0, 1);
  const model::StepPlan plan(layout, M);
  auto us = [&](const model::Unit& u) {
    const UnitFlops f = unit_flops(cfg.model, plan, u, seqs);
    return 1.5 * (f.fwd * 1e-6 + f.bwd * 2e-6) + 3;
  };
  std::vector<double> df(S), db(S), upd(S);
  for (int s = 0; s < S; ++s) {
    for (const auto& u : plan.forward_units(0, s, s + 1)) df[s] += us(u);
    for (const auto& u : plan.backward_units(0, s, s + 1)) db[s] += us(u);
    const int64_t params = plan.piece_size(model::StepPlan::kTiedPiece) + plan.piece_size(model::StepPlan::layer_piece(s));
    upd[s] = 1.5 * 0.01 * static_cast<double>(params) + 3;
  }
  const PipelineTimes t = pipeline_times(df, db, M, train::Schedule::k1F1B, [](int, int, double x) { return x; });
  const double t0 = std::max(t.end[0], t.end[1]);  // the tied gradient back at stage 0 (free links)
  const double end = std::max(t0 + upd[0], std::max(t.end[1], t0) + upd[1]);
  const StepPrediction r = simulate_pipeline(two_cores(S), p, cfg, S, train::Schedule::k1F1B, MpmdModel::kStatic);
  EXPECT_NEAR(r.step_us, end + 7 + 5 * 3 + 40, kTol);
  // Pathways' pipeline with the static model's costs and one factor for 2 and 3 processes.
  p.contention = {{2, 1.5}, {3, 1.5}};
  p.exec_us = 0, p.train_node_us = 3, p.node_step_us = 40;
  EXPECT_NEAR(simulate_pipeline(two_cores(S), p, cfg, S, train::Schedule::k1F1B).step_us, r.step_us, kTol);
}

// A profile calibrated before mpmd_train was measured loads (its other fields as before) and
// refuses the static model in one line; the static costs survive to_json / from_json; opbyop
// and spmd are not the static model's.
TEST(SimStatic, ProfileWithoutStaticCostsLoadsAndRefuses) {
  nlohmann::json j = static_profile().to_json();
  EXPECT_DOUBLE_EQ(j["static"]["node_us"].get<double>(), 3.0);
  const Profile q = Profile::from_json(j);
  ASSERT_TRUE(q.mpmd_static.has_value());
  EXPECT_DOUBLE_EQ(q.static_costs().step_us, 40.0);
  j.erase("static");
  const Profile old = Profile::from_json(j);
  EXPECT_FALSE(old.mpmd_static.has_value());
  EXPECT_DOUBLE_EQ(old.train_node_us, 1000.0);
  train::TrainConfig cfg = small_config(2, 8, 1);
  cfg.mesh.dp = 2;
  EXPECT_THROW(simulate_step(two_cores(2), old, cfg, ExecMode::kChained, MpmdModel::kStatic), Error);
  EXPECT_NO_THROW(simulate_step(two_cores(2), old, cfg, ExecMode::kChained));
  EXPECT_THROW(simulate_step(two_cores(2), q, cfg, ExecMode::kOpByOp, MpmdModel::kStatic), Error);
  EXPECT_THROW(simulate_step(two_cores(2), q, cfg, ExecMode::kSpmd, MpmdModel::kStatic), Error);
  EXPECT_EQ(parse_mpmd_model("static"), MpmdModel::kStatic);
  EXPECT_THROW(parse_mpmd_model("oneflow"), Error);
  EXPECT_THROW(simulate_static_chain(two_cores(2), old, chain16(), 0), Error);
}

// dispatch_bench's static chain of k = 16 computations: run + k (T + AllReduce + exec), no
// controller, no fetch, nothing stolen from the cores; the AllReduce here a 2-rank exchange of
// 4 bytes over a link of 1.5 us and 1 GB/s (hd: one message each way, 1.5 + 0.004 us).
TEST(SimStatic, DispatchChainIsRunPlusComputations) {
  Profile p = static_profile();
  p.intra = link(1.5, 1.0, 0);
  Cluster c = two_cores(2);
  c.intra = c.inter = p.intra;
  const double ar = simulate_allreduce(c, p, range(2), 4).end;
  EXPECT_NEAR(ar, 1.504, kTol);
  for (double T : {0.0, 100.0}) {
    const double end = 20 + 16 * (T + ar + 0.5);
    EXPECT_NEAR(simulate_static_chain(c, p, chain16(), T), 16 / (end * 1e-6), 1e-6) << T;
  }
}

}  // namespace
}  // namespace pwm::sim
