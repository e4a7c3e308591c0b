// The simulator against cases computed by hand (docs/simulator.md, "Tests"). Tolerances: the
// simulator adds and maxes doubles of a few thousand microseconds; 1e-6 us absolute is far
// above their rounding (~1e-12 relative) and far below any modelling error worth catching.
#include <gtest/gtest.h>

#include "collectives/cost_model.h"
#include "common/check.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "train/config.h"
#include "sim/collective.h"
#include "sim/dispatch.h"
#include "sim/moe.h"
#include "sim/step.h"

namespace pwm::sim {
namespace {

using collectives::Algorithm;

constexpr double kTol = 1e-6;

// A link of one latency and bandwidth (us, GB/s) and a per-message overhead (us).
Link link(double latency_us, double gbytes_per_s, double overhead_us) {
  Link l;
  l.latency_us = latency_us, l.gbytes_per_s = gbytes_per_s, l.overhead_us = overhead_us;
  return l;
}

Profile zero_profile() {
  Profile p;
  p.reduce_ns_per_byte = 0;
  p.intra = p.inter = p.inter_shaped = link(0, 1e12, 0);
  return p;
}

// The dispatch tests' controller and worker costs (us): a call with one node and two worker
// messages costs 30 + 5 + 2 x 2.5 = 40, a launch 4, a fetch 11.
Profile dispatch_profile() {
  Profile p = zero_profile();
  p.call_us = 30, p.node_us = 5, p.msg_us = 2.5, p.exec_us = 4, p.fetch_rtt_us = 11;
  return p;
}

// Chains of 16 computations on 2 workers.
DispatchOptions chain16() {
  DispatchOptions o;
  o.workers = 2;
  o.chain = 16;
  return o;
}

// A small model for the step tests (2 heads of 32, d_ff 128, 32 tokens per sequence).
train::TrainConfig small_config(int layers, int64_t batch, int microbatches) {
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

Cluster one_host(int devices, Link l) {
  Cluster c;
  c.hosts = 1;
  c.devices_per_host = devices;
  c.intra = c.inter = l;
  return c;
}

std::vector<int> range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Ring AllReduce of S bytes over n ranks, one segment per chunk, no reduction cost: 2(n-1)
// steps, each a chunk of S/n on the wire and one latency: 2(n-1)/n S/B + 2(n-1) L.
TEST(SimCollective, RingAllreduceMatchesAlphaBeta) {
  for (int n : {2, 3, 4, 5}) {
    const double B = 1.0, L = 10.0;  // GB/s, us
    const size_t S = static_cast<size_t>(n) * 4 * 60000;  // divisible by n, float elements
    const Profile p = zero_profile();
    const Cluster c = one_host(n, link(L, B, 0));
    const auto r = simulate_allreduce(c, p, range(n), S, Algorithm::kRing, {}, /*segment_bytes=*/S);
    const double want = 2.0 * (n - 1) / n * static_cast<double>(S) / (B * 1e3) + 2.0 * (n - 1) * L;
    EXPECT_NEAR(r.end, want, kTol) << "n=" << n;
    EXPECT_EQ(r.messages, static_cast<size_t>(n) * 2 * (n - 1));
  }
}

// Segments: with s segments per chunk and a port slower than a segment's round (s x wire >=
// wire + L), every step's sends stream back to back on each rank's port: 2(n-1) steps of s
// segment wires, then the last segment's latency.
TEST(SimCollective, SegmentedRingIsPortBound) {
  const int n = 4, segs = 8;
  const double B = 2.0, L = 5.0;
  const size_t S = 4u * n * segs * 1000;
  const Profile p = zero_profile();
  const Cluster c = one_host(n, link(L, B, 0));
  const auto r = simulate_allreduce(c, p, range(n), S, Algorithm::kRing, {}, S / n / segs);
  const double seg_us = static_cast<double>(S) / n / segs / (B * 1e3);
  ASSERT_GE(segs * seg_us, seg_us + L);  // the regime the formula is for
  EXPECT_NEAR(r.end, 2.0 * (n - 1) * segs * seg_us + L, kTol);
}

// Halving-doubling on p = 4: messages of S/2, S/4 then S/4, S/2: 1.5 S/B + 4 L.
TEST(SimCollective, HalvingDoublingMatchesAlphaBeta) {
  const double B = 1.0, L = 7.0;
  const size_t S = 4 * 100000;
  const Profile p = zero_profile();
  const Cluster c = one_host(4, link(L, B, 0));
  const auto r = simulate_allreduce(c, p, range(4), S, Algorithm::kHalvingDoubling);
  EXPECT_NEAR(r.end, 1.5 * static_cast<double>(S) / (B * 1e3) + 4 * L, kTol);
}

// AllToAll of m bytes per peer on one link (latency L, bandwidth B, no copy cost): pairwise's
// n-1 exchanges of m take (n-1)(L + m/B); Bruck's log2 n steps of b_k blocks, each waiting for a
// block the previous step brought, take sum_k (L + b_k m/B). Both are the cost model's
// alltoall_us with alpha = L, beta = 1/B and no copy cost.
TEST(SimCollective, AlltoallMatchesTheCostModel) {
  const double B = 2.0, L = 6.0;
  const size_t m = 4 * 30000;
  const Profile p = zero_profile();
  collectives::CostModel cm;
  cm.alpha_us = L, cm.beta_ns_per_byte = 1.0 / B, cm.gamma_ns_per_byte = 0;
  for (int n : {2, 3, 4, 5}) {
    const Cluster c = one_host(n, link(L, B, 0));
    const auto r = simulate_alltoall(c, p, range(n), m, Algorithm::kPairwise);
    EXPECT_NEAR(r.end, (n - 1) * (L + static_cast<double>(m) / (B * 1e3)), kTol) << "n=" << n;
    EXPECT_NEAR(r.end, cm.alltoall_us(Algorithm::kPairwise, m, n), kTol) << "n=" << n;
    EXPECT_EQ(r.messages, static_cast<size_t>(n * (n - 1)));
    EXPECT_NEAR(simulate_alltoall(c, p, range(n), m, Algorithm::kMpi).end, r.end, kTol);  // modelled as pairwise
  }
  for (int n : {2, 4, 8}) {
    const Cluster c = one_host(n, link(L, B, 0));
    const auto r = simulate_alltoall(c, p, range(n), m, Algorithm::kBruck);
    int steps = 0;
    while ((1 << steps) < n) ++steps;
    EXPECT_NEAR(r.end, steps * (L + n / 2 * static_cast<double>(m) / (B * 1e3)), kTol) << "n=" << n;
    EXPECT_NEAR(r.end, cm.alltoall_us(Algorithm::kBruck, m, n), kTol) << "n=" << n;
    EXPECT_EQ(r.messages, static_cast<size_t>(n * steps));
  }
  const Cluster c = one_host(2, link(L, B, 0));
  EXPECT_THROW(simulate_alltoall(c, p, range(2), m, Algorithm::kRing), pwm::Error);
  EXPECT_EQ(simulate_alltoall(one_host(1, link(L, B, 0)), p, range(1), m).end, 0.0);
}

// Two ranks: on one host the in-host link, on two hosts the cross-host link: 2 (S/2/B + L) each.
TEST(SimCollective, CrossHostUsesTheInterLink) {
  const size_t S = 4 * 40000;
  const Profile p = zero_profile();
  Cluster c;
  c.devices_per_host = 1;
  c.hosts = 2;
  c.intra = link(1, 100, 0);
  c.inter = link(20, 0.5, 3);
  const auto r = simulate_allreduce(c, p, range(2), S, Algorithm::kRing, {}, S);
  EXPECT_NEAR(r.end, 2 * (3 + static_cast<double>(S) / 2 / 0.5e3 + 20), kTol);
  c.devices_per_host = 2;
  c.hosts = 1;
  const auto q = simulate_allreduce(c, p, range(2), S, Algorithm::kRing, {}, S);
  EXPECT_NEAR(q.end, 2 * (static_cast<double>(S) / 2 / 100e3 + 1), kTol);
}

// A link with a measured rate per message size: at a measured size exactly that rate, between
// two sizes the rate interpolated in log(bytes) (halfway in log: the mean rate), outside the
// nearest; a 2-rank ring AllReduce of S bytes sends two messages of S/2 at the rate of S/2.
TEST(SimLink, RateBySizeInterpolatesInLogBytes) {
  Link l = link(10, 1.0, 0);
  l.gbytes_per_s_by_bytes = {{1000, 0.02}, {100000, 0.01}};
  EXPECT_NEAR(l.wire_us(1000), 1000 / 20.0, kTol);
  EXPECT_NEAR(l.wire_us(100000), 100000 / 10.0, kTol);
  EXPECT_NEAR(l.wire_us(10000), 10000 / 15.0, kTol);    // log-midpoint: (20 + 10) / 2 bytes/us
  EXPECT_NEAR(l.wire_us(10), 10 / 20.0, kTol);          // below the first size: its rate
  EXPECT_NEAR(l.wire_us(1e7), 1e7 / 10.0, kTol);        // above the last: its rate
  const Profile p = zero_profile();
  Cluster c;
  c.devices_per_host = 1;
  c.hosts = 2;
  c.inter = l;
  const size_t S = 20000;  // messages of 10000 bytes: 15 bytes/us
  const auto r = simulate_allreduce(c, p, range(2), S, Algorithm::kRing, {}, S);
  EXPECT_NEAR(r.end, 2 * (10000 / 15.0 + 10), kTol);
}

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

// Lowering a chain: k single-node calls on W workers is k nodes, one message per worker, k
// launches each; fused is one node.
TEST(SimDispatch, LoweredChainShape) {
  const LoweredShape s = lowered_chain(3, 5, false);
  EXPECT_EQ(s.nodes, 5);
  EXPECT_EQ(s.messages, 3);
  EXPECT_EQ(s.execs, (std::vector<int>{5, 5, 5}));
  const LoweredShape f = lowered_chain(3, 5, true);
  EXPECT_EQ(f.nodes, 1);
  EXPECT_EQ(f.execs, (std::vector<int>{1, 1, 1}));
}

// A chain of k OpByOp calls: each costs the controller c = call + node + W msg. When c exceeds
// a computation (T + launch), the controller is the bottleneck: k c + launch + T + fetch; when
// not, the devices are: c + k (launch + T) + fetch. Links free, AllReduce free.
TEST(SimDispatch, OpByOpChain) {
  const Profile p = dispatch_profile();
  const Cluster c = one_host(2, link(0, 1e12, 0));
  DispatchOptions o = chain16();
  const double call = 30 + 5 + 2 * 2.5;  // 40 us
  for (double T : {0.0, 10.0, 100.0, 1000.0}) {
    const double end = std::max(16 * call + 4 + T, call + 16 * (4 + T)) + 11;
    EXPECT_NEAR(simulate_chain(c, p, o, ExecMode::kOpByOp, T), 16 / (end * 1e-6), 1e-6 * 16 / (end * 1e-6)) << T;
  }
  // Chained: one call, 16 nodes, then the devices run back to back.
  const double ch = (30 + 16 * 5 + 2 * 2.5) + 16 * (4 + 50.0) + 11;
  EXPECT_NEAR(simulate_chain(c, p, o, ExecMode::kChained, 50), 16 / (ch * 1e-6), 1e-3);
  // The break-even of OpByOp sits where a computation outlasts a call: T + 4 >= 40 (at 95%
  // of SPMD, whose computation costs T here).
  std::vector<double> ts;
  for (double t = 1; t < 1e4; t += 1) ts.push_back(t);
  const double be = break_even(c, p, o, ExecMode::kOpByOp, ts);
  EXPECT_GT(be, 36.0 - 1e-9);
  EXPECT_LT(be, 200.0);
}

// A dp = 1 SPMD step is the plan's units back to back, the update and the overhead: the sum
// computed here from the FLOP counts directly.
TEST(SimStep, SingleRankIsSumOfUnits) {
  train::TrainConfig cfg = small_config(2, 4, 2);
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.opt_us_per_param = 0.01, p.step_overhead_us = 7;
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const model::ParamLayout layout(cfg.model, 0, 1);
  const model::StepPlan plan(layout, cfg.workload.microbatches);
  double want = 7 + 0.01 * static_cast<double>(layout.total());
  for (const auto& u : plan.units()) {
    const UnitFlops f = unit_flops(cfg.model, plan, u, 2);
    want += f.fwd * 1e-6 + f.bwd * 2e-6;
  }
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

// A step whose micro-batch size lies between two measured ones takes the interpolated rate:
// 2 sequences of 32 tokens = 64 tokens, halfway in log between 32 and 128, so the rates are
// (1000 + 3000) / 2 forward and (2000 + 6000) / 2 backward.
TEST(SimStep, MicrobatchSizeSelectsTheRate) {
  train::TrainConfig cfg = small_config(2, 4, 2);
  Profile p = zero_profile();
  p.rates = {{32, 1000, 2000}, {128, 3000, 6000}};
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const model::ParamLayout layout(cfg.model, 0, 1);
  const model::StepPlan plan(layout, cfg.workload.microbatches);
  double want = 0;
  for (const auto& u : plan.units()) {
    const UnitFlops f = unit_flops(cfg.model, plan, u, 2);
    want += f.fwd * 2000e-9 + f.bwd * 4000e-9;
  }
  EXPECT_NEAR(simulate_step(c, p, cfg, ExecMode::kSpmd).step_us, want, 1e-9 * want);
}

// The controller sharing 2 cores with 2 workers (3 processes): its work on each next call
// (40 us) is time-shared with the running kernel, min(T, 40) per kernel but the last (no call
// follows it). Controller-bound below, device-bound above: end = max(16 c + 4 + T,
// c + 16 (4 + T) + 15 min(T, c)) + fetch. One worker (2 processes on 2 cores): no sharing.
TEST(SimDispatch, OpByOpControllerSharesCores) {
  const Profile p = dispatch_profile();
  Cluster c = one_host(2, link(0, 1e12, 0));
  c.cores_per_host = 2;
  DispatchOptions o = chain16();
  const double call = 40;
  for (double T : {0.0, 10.0, 100.0, 1000.0}) {
    const double end = std::max(16 * call + 4 + T, call + 16 * (4 + T) + 15 * std::min(T, call)) + 11;
    EXPECT_NEAR(simulate_chain(c, p, o, ExecMode::kOpByOp, T), 16 / (end * 1e-6), 1e-6 * 16 / (end * 1e-6)) << T;
  }
  o.workers = 1;
  const double call1 = 30 + 5 + 2.5;
  const double end1 = std::max(16 * call1 + 4 + 100, call1 + 16 * (4 + 100.0)) + 11;
  EXPECT_NEAR(simulate_chain(c, p, o, ExecMode::kOpByOp, 100), 16 / (end1 * 1e-6), 1e-6 * 16 / (end1 * 1e-6));
}

// spmd_exec_us is paid once per computation by the SPMD loop, program_exec_us inside programs:
// by hand, fused and chained over 16 computations end 16 x 0.7 us later with program_exec_us =
// 0.7 and not at all later with spmd_exec_us = 0.5, SPMD the other way round (the fixed costs
// as in OpByOpChain); OpByOp at T = 100 us is device-bound and ends 16 x 0.7 later; at T = 0 it
// is controller-bound and only the last computation's 0.7 shows.
TEST(SimDispatch, ExecPerComputationByMode) {
  const Profile p = dispatch_profile();
  const Cluster c = one_host(2, link(0, 1e12, 0));
  DispatchOptions o = chain16();
  Profile qs = p, qp = p;
  qs.spmd_exec_us = 0.5;
  qp.program_exec_us = 0.7;
  auto end_us = [&](const Profile& pr, const char* mode, double T) { return 16 / simulate_chain(c, pr, o, parse_exec_mode(mode), T) * 1e6; };
  for (double T : {0.0, 100.0}) {
    for (const char* m : {"fused", "chained"}) {
      EXPECT_NEAR(end_us(qp, m, T) - end_us(p, m, T), 16 * 0.7, 1e-6) << m << " " << T;
      EXPECT_NEAR(end_us(qs, m, T), end_us(p, m, T), 1e-6) << m << " " << T;
    }
    EXPECT_NEAR(end_us(qs, "spmd", T) - end_us(p, "spmd", T), 16 * 0.5, 1e-6) << T;
    EXPECT_NEAR(end_us(qp, "spmd", T), end_us(p, "spmd", T), 1e-6) << T;
  }
  EXPECT_NEAR(end_us(qp, "opbyop", 100) - end_us(p, "opbyop", 100), 16 * 0.7, 1e-6);
  EXPECT_NEAR(end_us(qp, "opbyop", 0) - end_us(p, "opbyop", 0), 0.7, 1e-6);
  EXPECT_NEAR(end_us(qs, "opbyop", 100), end_us(p, "opbyop", 100), 1e-6);
  // By formula: fused = call + node + 2 msg + exec + 16 (T + 0.7) + fetch.
  EXPECT_NEAR(end_us(qp, "fused", 100), 40 + 4 + 16 * 100.7 + 11, 1e-6);
}

// A profile without program_exec_us (written before it) charges programs spmd_exec_us, as the
// simulator did then; with it, each its own.
TEST(SimProfile, ProgramExecDefaultsToSpmdExec) {
  nlohmann::json j = dispatch_profile().to_json();
  j["dispatch"]["spmd_exec_us"] = 0.25;
  j["dispatch"].erase("program_exec_us");
  EXPECT_DOUBLE_EQ(Profile::from_json(j).program_exec_us, 0.25);
  j["dispatch"]["program_exec_us"] = 0.75;
  const Profile q = Profile::from_json(j);
  EXPECT_DOUBLE_EQ(q.program_exec_us, 0.75);
  EXPECT_DOUBLE_EQ(q.spmd_exec_us, 0.25);
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


// ---- The static model (mpmd_train, MpmdModel::kStatic) -------------------------------------

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

// ---- Mixture of Experts (sim/moe.h) ---------------------------------------------------------

// small_config with E = 4 experts, top-2, MoE in layer 1 of 2 (moe_every 2), dp x ep.
train::TrainConfig moe_config(int64_t batch, int microbatches, int dp, int ep, double capacity) {
  train::TrainConfig cfg = small_config(2, batch, microbatches);
  cfg.model.experts = 4, cfg.model.top_k = 2, cfg.model.moe_every = 2, cfg.model.capacity_factor = capacity;
  cfg.mesh.dp = dp, cfg.mesh.ep = ep;
  return cfg;
}

// Rows by hand: N = 64 tokens, K = 2, E = 4. Capacity 1.25: cap = ceil(1.25 x 2 x 64 / 4) = 40,
// a device computes E cap = 160 rows whatever P, and sends (E/P) cap = 80 to each of P = 2 peers.
// Dropless: K N = 128 rows, x the imbalance; per peer ceil(1.5 x 128 / 2) = 96.
TEST(SimMoe, RowsByHand) {
  model::Config m = moe_config(4, 1, 2, 2, 1.25).model;
  MoeRows r = moe_rows(m, 64, 2, 1.0);
  EXPECT_DOUBLE_EQ(r.device, 160);
  EXPECT_DOUBLE_EQ(r.per_peer, 80);
  EXPECT_DOUBLE_EQ(moe_rows(m, 64, 1, 1.0).device, 160);
  m.capacity_factor = 0;
  r = moe_rows(m, 64, 2, 1.5);
  EXPECT_DOUBLE_EQ(r.device, 192);
  EXPECT_DOUBLE_EQ(r.per_peer, 96);
  EXPECT_THROW(moe_rows(m, 64, 2, 0.5), pwm::Error);
  EXPECT_THROW(moe_rows(m, 64, 2, 2.5), pwm::Error);  // more than all rows on one of 2 devices
}

// A dp 1 step with a capacity computes E cap rows per MoE layer and micro-batch, dropless K N:
// the two steps differ by (E cap - K N) rows x (6 F C at the forward rate + 12 F C at the
// backward rate) per micro-batch, nothing else (links free, one device). And the capacity step
// is by hand: the dense units as sim/step.h counts them, the MoE block's attention, norm and
// router (C + 2 D C + 2 H D C + E C parameters) plus its 160 rows.
TEST(SimMoe, CapacityComputesCapacityRows) {
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.opt_us_per_param = 0.01, p.step_overhead_us = 7;
  const Cluster c = one_host(1, link(0, 1e12, 0));
  const train::TrainConfig cap = moe_config(4, 2, 1, 1, 1.25), drop = moe_config(4, 2, 1, 1, 0);
  const double C = 64, D = 32, H = 2, F = 128, E = 4, T = 32, N = 2 * 32;  // 2 sequences a micro-batch
  const double rows_cap = 4 * 40, rows_drop = 2 * N;
  const double per_row = 6 * F * C * 1000e-9 + 12 * F * C * 2000e-9;
  const MoeStep a = simulate_moe_step(c, p, cap, ExecMode::kSpmd), b = simulate_moe_step(c, p, drop, ExecMode::kSpmd);
  EXPECT_NEAR(a.step.step_us - b.step.step_us, 2 * (rows_cap - rows_drop) * per_row, 1e-6);
  // By hand: layer 0 dense (unit_flops), layer 1 MoE, embedding and head, 2 micro-batches.
  const model::ParamLayout layout(cap.model, 0, 1);
  const model::StepPlan plan(layout, 2);
  double want = 7 + 0.01 * static_cast<double>(layout.total());
  for (const auto& u : plan.units()) {
    if (u.layer == 1) continue;
    const UnitFlops f = unit_flops(cap.model, plan, u, 2);
    want += f.fwd * 1e-6 + f.bwd * 2e-6;
  }
  const double dense = C + 2 * D * C + 2 * H * D * C + E * C, attn = 4 * H * D * T;
  const double fwd = (2 * dense + attn) * N + 6 * F * C * rows_cap;
  want += 2 * (fwd * 1e-6 + 2 * fwd * 2e-6);
  EXPECT_NEAR(a.step.step_us, want, 1e-9 * want);
  EXPECT_EQ(a.step.collectives, 0);
  EXPECT_EQ(a.alltoall_total_us, 0.0);  // P = 1: no AllToAll
}

// The rows' AllToAll over P = 2 devices on a link of latency L and bandwidth B: one exchange of
// (E/P) cap rows x C x 4 bytes each way, L + bytes / B (the pairwise formula of
// AlltoallMatchesTheCostModel at n = 2; Bruck's one step is the same). Per MoE layer and
// micro-batch two forward and two backward; dropless adds the counts, E/P int64 per peer.
TEST(SimMoe, AlltoallBytes) {
  Profile p = zero_profile();
  const double L = 4, B = 2;  // us, GB/s
  const Cluster c = one_host(2, link(L, B, 0));
  const double C = 64, cap = 40;
  const double rows_us = L + 2 * cap * C * 4 / (B * 1e3);  // (E/P) cap = 2 cap rows per peer
  // Batch 12 over dp 2 and 3 micro-batches: 2 sequences a micro-batch, N = 64, cap = 40 as above.
  const MoeStep r = simulate_moe_step(c, p, moe_config(12, 3, 2, 2, 1.25), ExecMode::kSpmd);
  EXPECT_NEAR(r.layer.alltoall_fwd_us, 2 * rows_us, kTol);
  EXPECT_NEAR(r.layer.alltoall_bwd_us, 2 * rows_us, kTol);
  EXPECT_NEAR(r.alltoall_total_us, 3 * 4 * rows_us, kTol);  // 1 MoE layer x 3 micro-batches
  const MoeStep d = simulate_moe_step(c, p, moe_config(12, 3, 2, 2, 0), ExecMode::kSpmd);
  const double drop_us = L + 64 * C * 4 / (B * 1e3);  // K N / P = 64 rows per peer
  const double counts_us = L + 2 * 8 / (B * 1e3);     // E/P = 2 int64
  EXPECT_NEAR(d.layer.counts_us, counts_us, kTol);
  EXPECT_NEAR(d.alltoall_total_us, 3 * (4 * drop_us + counts_us), kTol);
}

// --moe-routing controller against worker, chained, dp 2 = P, one MoE layer, 2 micro-batches of
// one sequence (N = 32): the controller's step is the worker's plus, per MoE layer and
// micro-batch, the moe_counts node (its kernel, (2 C E + C) N FLOPs, and a node's exec 4 +
// train_node 6 us) and the round trip, minus the counts AllToAll the workers no longer run
// (L + 2 x 8 bytes / B). The round trip by hand (controller link = the in-host link, L = 3 us,
// 1 GB/s): fetch 11 + 2 x 32 bytes, put 2 x 2.5 + 2 x 64 bytes, dispatch of a segment of 9 nodes
// 30 + 9 x 5 + 2 x 2.5, one latency: 99.192 us. Segments by hand: block_fwd(1), head, block_bwd
// 1 and 0, embed_bwd, then batch, embed, block_fwd(0), moe_counts of micro-batch 1 (9); the last:
// its 5 units, 3 AllReduce nodes and the update (9).
TEST(SimMoe, ControllerIsWorkerPlusRoundTrips) {
  Profile p = dispatch_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000, p.train_node_us = 6, p.node_step_us = 9;
  const Cluster c = one_host(2, link(3, 1, 0));
  train::TrainConfig cfg = moe_config(4, 2, 2, 2, 0);
  const double rt = 11 + 2 * 0.032 + 2 * 2.5 + 2 * 0.064 + (30 + 9 * 5 + 2 * 2.5) + 3;
  EXPECT_NEAR(controller_round_trip_us(c, p, cfg, 9), rt, kTol);
  // dp 4: four fetch messages of E = 4 int64, four puts of 2E int64 (64 bytes: what a device's
  // block_fwd reads, Shapes::route_counts) whatever dp, four dispatch messages.
  train::TrainConfig cfg4 = moe_config(8, 2, 4, 2, 0);
  const Cluster c4 = one_host(4, link(3, 1, 0));
  EXPECT_NEAR(controller_round_trip_us(c4, p, cfg4, 9), 11 + 4 * 0.032 + 4 * 2.5 + 4 * 0.064 + (30 + 9 * 5 + 4 * 2.5) + 3,
              kTol);
  cfg.mpmd.moe_routing = train::MoeRouting::kWorker;
  const MoeStep w = simulate_moe_step(c, p, cfg, ExecMode::kChained);
  cfg.mpmd.moe_routing = train::MoeRouting::kController;
  const MoeStep k = simulate_moe_step(c, p, cfg, ExecMode::kChained);
  const double counts_kernel = (2 * 64 * 4 + 64) * 32 * 1000e-9, node = 4 + 6, counts_a2a = 3 + 16 / 1e3;
  EXPECT_EQ(k.round_trips, 2);
  EXPECT_NEAR(k.layer.round_trip_us, rt, kTol);
  EXPECT_NEAR(k.step.step_us - w.step.step_us, 2 * (rt + counts_kernel + node - counts_a2a), 1e-6);
  EXPECT_EQ(k.step.nodes - w.step.nodes, 2);
  EXPECT_NEAR(w.layer.counts_us, counts_a2a, kTol);
  EXPECT_EQ(k.layer.counts_us, 0.0);
  // What pathways_train refuses is refused here too.
  EXPECT_THROW(simulate_moe_step(c, p, cfg, ExecMode::kFused), pwm::Error);
  EXPECT_THROW(simulate_moe_step(c, p, cfg, ExecMode::kOpByOp), pwm::Error);
  cfg.mpmd.moe_routing = train::MoeRouting::kStatic;
  EXPECT_THROW(simulate_moe_step(c, p, cfg, ExecMode::kChained), pwm::Error);  // static needs a capacity
  EXPECT_NO_THROW(simulate_moe_step(c, p, cfg, ExecMode::kSpmd));               // SPMD: dropless as the model says
}

// Dropless rows follow the imbalance: at 1.5 the busiest device computes 0.5 K N more rows per
// MoE layer and micro-batch than balanced, each 6 F C FLOPs forward and 12 F C backward (links
// free: the AllToAll's extra bytes cost nothing).
TEST(SimMoe, ImbalanceAddsRowsToTheBusiestDevice) {
  Profile p = zero_profile();
  p.fwd_us_per_gflop = 1000, p.bwd_us_per_gflop = 2000;
  const Cluster c = one_host(2, link(0, 1e12, 0));
  const train::TrainConfig cfg = moe_config(8, 2, 2, 2, 0);  // 2 sequences a micro-batch: N = 64
  const double per_row = 6 * 128 * 64 * 1000e-9 + 12 * 128 * 64 * 2000e-9;
  MoeOptions o;
  const double one = simulate_moe_step(c, p, cfg, ExecMode::kSpmd, o).step.step_us;
  o.imbalance = 1.5;
  const double more = simulate_moe_step(c, p, cfg, ExecMode::kSpmd, o).step.step_us;
  EXPECT_NEAR(more - one, 2 * 0.5 * 2 * 64 * per_row, 1e-6);
}

}  // namespace
}  // namespace pwm::sim
