// The simulator's training step against cases computed by hand (docs/simulator.md, "Tests"):
// the pipeline's schedules, an SPMD step as the sum of its units, the emulated network's CPU,
// the gradient buckets' cut, the kernel rate by micro-batch size, a micro-batch's overhead, an
// OpByOp step's cost per call.
#include <gtest/gtest.h>

#include "model/params.h"
#include "model/step_plan.h"
#include "sim/step.h"
#include "tests/sim/sim_test_util.h"

namespace pwm::sim {
namespace {

using testing::kTol;
using testing::link;
using testing::zero_profile;
using testing::small_config;
using testing::one_host;

// GPipe and 1F1B with S equal stages of forward f and backward b: the makespan is
// (M + S - 1)(f + b), so the bubble is (S - 1) / (M + S - 1).
TEST(SimPipeline, BubbleMatchesFormula) {
  for (const char* sched : {"gpipe", "1f1b"}) {
    for (int S : {1, 2, 4}) {
      for (int64_t M : {1, 4, 8}) {
        const double f = 3.0, b = 6.0;
        const auto t = pipeline_times(std::vector<double>(S, f), std::vector<double>(S, b), M, pwm::train::parse_schedule(sched),
                                      [](int, int, double t) { return t; });
        double end = 0, busy = 0;
        for (int s = 0; s < S; ++s) end = std::max(end, t.end[s]), busy += t.busy[s];
        EXPECT_NEAR(end, static_cast<double>(M + S - 1) * (f + b), kTol) << sched << " S=" << S << " M=" << M;
        EXPECT_NEAR(1.0 - busy / S / end, static_cast<double>(S - 1) / static_cast<double>(M + S - 1), kTol);
      }
    }
  }
}

// A link delay d between stages adds 2 (S - 1) d to GPipe's makespan (one per hop, forward and back).
TEST(SimPipeline, LinkDelayOnCriticalPath) {
  const int S = 3;
  const int64_t M = 4;
  const double f = 2.0, b = 4.0, d = 0.5;
  const auto t = pipeline_times(std::vector<double>(S, f), std::vector<double>(S, b), M, pwm::train::Schedule::kGpipe,
                                [&](int, int, double t) { return t + d; });
  EXPECT_NEAR(t.end[0], (M + S - 1) * (f + b) + 2 * (S - 1) * d, kTol);
}

// The plan's units of `cfg` back to back on one device, 2 sequences a micro-batch, at these
// rates (us per GFLOP): the FLOP sum the dp = 1 cases below compare the simulator with.
double units_us(const train::TrainConfig& cfg, double fwd_us_per_gflop, double bwd_us_per_gflop) {
  const model::ParamLayout layout(cfg.model, 0, 1);
  const model::StepPlan plan(layout, cfg.workload.microbatches);
  double us = 0;
  for (const auto& u : plan.units()) {
    const UnitFlops f = unit_flops(cfg.model, plan, u, 2);
    us += (f.fwd * fwd_us_per_gflop + f.bwd * bwd_us_per_gflop) * 1e-9;
  }
  return us;
}

// A dp = 1 SPMD step is the plan's units back to back, the update and the overhead: the sum
// computed here from the FLOP counts directly.
TEST(SimStep, SingleRankIsSumOfUnits) {
  train::TrainConfig cfg = small_config(2, 4, 2);
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.opt_us_per_param = 0.01, p.step_overhead_us = 7;
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const model::ParamLayout layout(cfg.model, 0, 1);
  const double want = 7 + 0.01 * static_cast<double>(layout.total()) + units_us(cfg, 1000, 2000);
  const StepPrediction r = simulate_step(c, p, cfg, ExecMode::kSpmd);
  EXPECT_NEAR(r.step_us, want, 1e-6 * want);
  EXPECT_EQ(r.collectives, 0);
}

// The emulated network's CPU (Link::cpu_ns_per_byte): two hosts sharing one machine's cores,
// dp 2. Each rank sends and receives its whole gradient buffer once (a 2-rank ring: two halves
// each way), so the kernels take 2 x 4 bytes x parameters x the cost longer; nothing changes on
// hosts with cores of their own, or on one host.
TEST(SimStep, EmulatedNetworkCpuSlowsTheKernels) {
  train::TrainConfig cfg = small_config(2, 4, 1);
  cfg.mesh.dp = 2;
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.opt_us_per_param = 0.01;
  Cluster c;
  c.hosts = 2;
  c.devices_per_host = 1;
  c.intra = link(0, 1e12, 0);
  c.inter = link(0, 1e12, 0);
  c.cores_per_host = 2;
  c.hosts_share_cores = true;
  const StepPrediction free_net = simulate_step(c, p, cfg, ExecMode::kSpmd);
  c.inter.cpu_ns_per_byte = 3.0;
  const StepPrediction r = simulate_step(c, p, cfg, ExecMode::kSpmd);
  const double params = static_cast<double>(model::ParamLayout(cfg.model, 0, 1).total());
  const double want = 2 * 4 * params * 3.0 * 1e-3;  // us
  EXPECT_NEAR(r.compute_us - free_net.compute_us, want, 1e-9 * r.compute_us);
  EXPECT_NEAR(r.step_us - free_net.step_us, want, 1e-9 * r.step_us);  // the exchange is free
  c.hosts_share_cores = false;
  EXPECT_NEAR(simulate_step(c, p, cfg, ExecMode::kSpmd).step_us, free_net.step_us, 1e-9 * r.step_us);
}

// BucketedAllreduce's cut: units listed from the end, buckets closed at the cap, a unit larger
// than a bucket split.
TEST(SimStep, BucketCut) {
  const auto b = cut_buckets({{60, 100}, {10, 60}, {0, 10}}, 30 * sizeof(float));
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].begin, 70);
  EXPECT_EQ(b[0].end, 100);
  EXPECT_EQ(b[0].last_unit, 0);
  EXPECT_EQ(b[1].begin, 40);
  EXPECT_EQ(b[1].last_unit, 1);
  EXPECT_EQ(b[2].begin, 10);
  EXPECT_EQ(b[2].last_unit, 1);
  EXPECT_EQ(b[3].begin, 0);
  EXPECT_EQ(b[3].end, 10);
  EXPECT_EQ(b[3].last_unit, 2);
}

// The default sizing (bucket_bytes 0, issue 18) on the default model's plan: a first bucket of
// 1 MiB, then about a quarter of the gradient each, so that buckets become ready during the
// backward (after layers L-1, L-2, ...), not all after it as one 25 MiB bucket did.
TEST(SimStep, AutoBucketsStartDuringBackward) {
  const model::Config m;  // the default model (15.5 MB of gradient)
  const model::ParamLayout layout(m, 0, 1);
  const model::StepPlan plan(layout, 1);
  const auto& units = plan.finish_order();  // final_norm, layer 3, 2, 1, 0, embed
  ASSERT_EQ(units.size(), 6u);
  const auto b = cut_buckets(units, 0);
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ((b[0].end - b[0].begin) * 4, 1 << 20);
  const int64_t quarter = (layout.total() * 4 + 3) / 4 / 4;  // floats
  for (int i = 1; i < 4; ++i) EXPECT_EQ(b[static_cast<size_t>(i)].end - b[static_cast<size_t>(i)].begin, quarter);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b[static_cast<size_t>(i)].last_unit, i + 1) << "bucket " << i;
  EXPECT_EQ(b.front().end, layout.total());
  EXPECT_EQ(b.back().begin, 0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_EQ(b[i].end, b[i - 1].begin);
  // A gradient of 10 GiB (one unit): 25 MiB buckets would be 410, more than the hierarchical
  // form's 256; the default then makes at most 256.
  const int64_t big = int64_t{10} << 28;  // floats
  EXPECT_LE(cut_buckets({{0, big}}, 0).size(), 256u);
  // The old default, one 25 MiB bucket: ready only after the last unit (the embedding).
  const auto one = cut_buckets(units, 25 << 20);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].last_unit, 5);
}

// The kernel rate between two measured micro-batch sizes: linear in log(tokens), so halfway in
// log (256 between 128 and 512) is the mean of the two rates; outside, the nearest measured one.
TEST(SimProfile, RateInterpolatesInLogTokens) {
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 9, p.bwd_us_per_gflop = 9;
  EXPECT_DOUBLE_EQ(p.rate_at(100).fwd_us_per_gflop, 9.0);  // no table: the scalars
  p.rates = {{128, 2000, 4000}, {512, 4000, 8000}};
  EXPECT_NEAR(p.rate_at(256).fwd_us_per_gflop, 3000, kTol);
  EXPECT_NEAR(p.rate_at(256).bwd_us_per_gflop, 6000, kTol);
  EXPECT_NEAR(p.rate_at(128).fwd_us_per_gflop, 2000, kTol);
  EXPECT_NEAR(p.rate_at(64).fwd_us_per_gflop, 2000, kTol);
  EXPECT_NEAR(p.rate_at(1024).bwd_us_per_gflop, 8000, kTol);
  // Through JSON and back, as sim_calibrate.sh writes it.
  const Profile q = Profile::from_json(p.to_json());
  ASSERT_EQ(q.rates.size(), 2u);
  EXPECT_NEAR(q.rate_at(256).bwd_us_per_gflop, 6000, kTol);
  nlohmann::json j = p.to_json();
  j["kernels"]["rates"] = nlohmann::json::array({{{"tokens", 512}, {"fwd_us_per_gflop", 1}, {"bwd_us_per_gflop", 1}},
                                                 {{"tokens", 128}, {"fwd_us_per_gflop", 1}, {"bwd_us_per_gflop", 1}}});
  EXPECT_THROW(Profile::from_json(j), Error);
}

// The width factor: 1 at the calibration's width, the measured factor at the reference model's,
// linear in log(d_model) between (128 * sqrt(2) is halfway between 128 and 256 in log), the
// nearest outside; it multiplies the tokens' curve, fwd and bwd each by its own factor.
TEST(SimProfile, WidthScaleInterpolatesInLogWidth) {
  Profile p = zero_profile();
  p.rates = {{128, 2000, 4000}, {512, 4000, 8000}};
  p.width_scales = {{128, 1.0, 1.0}, {256, 0.8, 0.9}};
  EXPECT_NEAR(p.rate_at(256, 0).fwd_us_per_gflop, 3000, kTol);  // width unknown: no factor
  EXPECT_NEAR(p.rate_at(256, 128).fwd_us_per_gflop, 3000, kTol);
  EXPECT_NEAR(p.rate_at(256, 256).fwd_us_per_gflop, 3000 * 0.8, kTol);
  EXPECT_NEAR(p.rate_at(256, 256).bwd_us_per_gflop, 6000 * 0.9, kTol);
  EXPECT_NEAR(p.rate_at(512, 128 * std::sqrt(2.0)).fwd_us_per_gflop, 4000 * 0.9, 1e-6);
  EXPECT_NEAR(p.rate_at(512, 768).bwd_us_per_gflop, 8000 * 0.9, kTol);  // beyond: the widest's
  EXPECT_NEAR(p.rate_at(512, 64).bwd_us_per_gflop, 8000, kTol);         // below: the narrowest's
  const Profile q = Profile::from_json(p.to_json());
  ASSERT_EQ(q.width_scales.size(), 2u);
  EXPECT_NEAR(q.rate_at(256, 256).fwd_us_per_gflop, 3000 * 0.8, kTol);
  nlohmann::json j = p.to_json();
  j["kernels"]["width_scales"][1]["d_model"] = 64;  // out of order
  EXPECT_THROW(Profile::from_json(j), Error);
  j["kernels"].erase("width_scales");  // a profile from before: 1 at every width
  EXPECT_NEAR(Profile::from_json(j).rate_at(256, 768).fwd_us_per_gflop, 3000, kTol);
}

// The step's kernels take the width's factor: a dp-1 step of a model of the widest measured
// width under a factor of 0.5 (fwd) and 0.25 (bwd) is the FLOP sum at those rates.
TEST(SimStep, KernelsTakeTheWidthFactor) {
  train::TrainConfig cfg = small_config(2, 4, 2);
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000;
  p.width_scales = {{static_cast<double>(cfg.model.d_model) / 2, 1.0, 1.0}, {static_cast<double>(cfg.model.d_model), 0.5, 0.25}};
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const double want = units_us(cfg, 500, 500);
  EXPECT_NEAR(simulate_step(c, p, cfg, ExecMode::kSpmd).step_us, want, 1e-9 * want);
}

// A step whose micro-batch size lies between two measured ones takes the interpolated rate:
// 2 sequences of 32 tokens = 64 tokens, halfway in log between 32 and 128, so the rates are
// (1000 + 3000) / 2 forward and (2000 + 6000) / 2 backward.
TEST(SimStep, MicrobatchSizeSelectsTheRate) {
  train::TrainConfig cfg = small_config(2, 4, 2);
  Profile p = zero_profile();
  p.rates = {{32, 1000, 2000}, {128, 3000, 6000}};
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const double want = units_us(cfg, 2000, 4000);
  EXPECT_NEAR(simulate_step(c, p, cfg, ExecMode::kSpmd).step_us, want, 1e-9 * want);
}

// A micro-batch's own overhead: dp = 1 at 1 and at 3 micro-batches of the same batch differ
// in their overhead by 2 x microbatch_overhead_us plus the FLOPs' difference (none: the same
// tokens), at a constant rate.
TEST(SimStep, MicrobatchOverhead) {
  train::TrainConfig cfg = small_config(1, 6, 1);
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.step_overhead_us = 7, p.microbatch_overhead_us = 13;
  const Cluster c = one_host(1, link(0, 1e12, 0));
  cfg.workload.microbatches = 1;
  const double one = simulate_step(c, p, cfg, ExecMode::kSpmd).step_us;
  cfg.workload.microbatches = 3;
  const double three = simulate_step(c, p, cfg, ExecMode::kSpmd).step_us;
  EXPECT_NEAR(three - one, 2 * 13.0, 1e-6 * one);
}

// OpByOp: the controller calls node by node. With kernels of no cost the step is controller-bound,
// so a training call's extra cost (train_call_us) adds once per call: once per node (the units
// and the update) at dp 1.
// Chained (one program) does not call per node and does not change.
TEST(SimStep, OpByOpPaysTheTrainingCallPerNode) {
  const train::TrainConfig cfg = small_config(1, 4, 2);
  Profile p = zero_profile();
  p.call_us = 10;
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const StepPrediction base = simulate_step(c, p, cfg, ExecMode::kOpByOp), chained = simulate_step(c, p, cfg, ExecMode::kChained);
  p.train_call_us = 100;
  const StepPrediction more = simulate_step(c, p, cfg, ExecMode::kOpByOp);
  ASSERT_GT(base.nodes, 0);
  EXPECT_NEAR(more.step_us - base.step_us, 100.0 * base.nodes, 1e-6 * more.step_us);
  EXPECT_NEAR(simulate_step(c, p, cfg, ExecMode::kChained).step_us, chained.step_us, 1e-9);
}

}  // namespace
}  // namespace pwm::sim
