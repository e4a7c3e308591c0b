// The simulator's dispatch against cases computed by hand (docs/simulator.md, "Tests"): a
// lowered chain's shape, OpByOp's chain controller- or device-bound, the controller sharing the
// cores, the per-computation costs of each execution mode and the profile's defaults for them.
#include <gtest/gtest.h>

#include "sim/dispatch.h"
#include "tests/sim/sim_test_util.h"

namespace pwm::sim {
namespace {

using testing::link;
using testing::dispatch_profile;
using testing::chain16;
using testing::one_host;

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

}  // namespace
}  // namespace pwm::sim
