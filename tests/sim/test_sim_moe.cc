// The simulator's Mixture of Experts step (sim/moe.h) against cases computed by hand
// (docs/simulator.md, "Tests"): the rows a device computes and sends, capacity against
// dropless, the AllToAll's bytes, the controller's routing round trips, imbalance.
#include <gtest/gtest.h>

#include "common/check.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "sim/moe.h"
#include "tests/sim/sim_test_util.h"

namespace pwm::sim {
namespace {

using testing::kTol;
using testing::link;
using testing::zero_profile;
using testing::dispatch_profile;
using testing::small_config;
using testing::one_host;

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
