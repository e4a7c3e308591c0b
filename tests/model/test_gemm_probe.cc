// The model-shape GEMM probe (model/gemm_probe.h): its list of a step's products against the
// FLOPs counted by hand for small configs and against the products a real forward and backward
// calls (gemm profiling, shape by shape); its rate is positive and never falls between probes.
// No timing is asserted.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>

#include "model/gemm_probe.h"
#include "model/kernels.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {
namespace {

// C = 16, L = 2, H = 2 heads of D = 8, F = 32, V = 32, T = 40 (two causal blocks of query rows:
// [0, 32) and [32, 40)).
Config small_config() {
  Config c;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.head_dim = 8;
  c.d_ff = 32;
  c.vocab = 32;
  c.seq_len = 40;
  return c;
}

TEST(GemmProbe, FlopsOfADenseStepByHand) {
  // B = 3 sequences: N = 120 rows. Fused matrices: R_in = 2D + H D + 2F = 96, R_out = H D + F = 48.
  // Per layer, the projections: forward h.w_in^T and ag.w_out; backward d(ag), d(w_out), d(h) and
  // d(w_in) (split in two products): 6 N C (R_in + R_out).
  const double linear = 6.0 * 120 * 16 * (96 + 48);
  // Per layer and sequence, the attention: scores and p.v forward, d(p), d(v), d(q), d(k)
  // backward, each 2 rows t1 D per block (rows = query rows x heads, t1 = keys up to the block's
  // end): 12 D (64 x 32 + 16 x 40).
  const double attention = 3 * 12.0 * 8 * (64 * 32 + 16 * 40);
  // The head: logits, d(E) and d(hf), 2 N V C each.
  const double head = 6.0 * 120 * 32 * 16;
  ASSERT_EQ(2 * (linear + attention) + head, 5234688.0);
  EXPECT_EQ(gemm_flops(step_gemm_calls(ParamLayout(small_config(), 0, 1), 3)), 5234688.0);

  // A tp shard of 2: one local head, 16 local MLP columns (R_in = 16 + 8 + 32, R_out = 8 + 16);
  // the head is every rank's.
  const double linear_tp = 6.0 * 120 * 16 * (56 + 24);
  const double attention_tp = 3 * 12.0 * 8 * (32 * 32 + 8 * 40);
  EXPECT_EQ(gemm_flops(step_gemm_calls(ParamLayout(small_config(), 1, 2), 3)), 2 * (linear_tp + attention_tp) + head);
}

TEST(GemmProbe, FlopsOfAnMoeStepByHand) {
  // Every layer MoE, E = 4 experts, top-2, capacity 1.25: ceil(1.25 x 2 x 120 / 4) = 75 rows per
  // expert. A layer's fused matrices hold the attention only: R_in = 2D + H D = 32, R_out = 16.
  Config c = small_config();
  c.experts = 4;
  c.top_k = 2;
  c.moe_every = 1;
  c.capacity_factor = 1.25;
  const double linear = 6.0 * 120 * 16 * (32 + 16);
  const double attention = 3 * 12.0 * 8 * (64 * 32 + 16 * 40);
  // An expert: x.w_gate_up^T [rows, 2F] and ge.w_down forward, four products backward: 6 rows C
  // 3F over 4 experts of 75 rows.
  const double experts = 4 * 6.0 * 75 * 16 * 3 * 32;
  const double head = 6.0 * 120 * 32 * 16;
  EXPECT_EQ(gemm_flops(step_gemm_calls(ParamLayout(c, 0, 1), 3)), 2 * (linear + attention + experts) + head);
  // Dropless: the N K = 240 routed rows, whatever the split.
  c.capacity_factor = 0;
  EXPECT_EQ(gemm_flops(step_gemm_calls(ParamLayout(c, 0, 1), 3)),
            2 * (linear + attention + 6.0 * 240 * 16 * 3 * 32) + head);
}

// What one forward_backward calls, by (op(A) op(B) MxNxK) as gemm profiling names it.
std::map<std::string, int64_t> profiled_step(const ParamLayout& layout, int64_t B) {
  const size_t P = static_cast<size_t>(layout.total());
  std::vector<float> params(P);
  std::vector<float> grads(P, 0.0f);
  init_params(layout, 5, params.data());
  const std::vector<int32_t> tokens = testing::random_tokens(layout.config(), B, 3);
  Workspace<float> ws(layout, B);
  set_gemm_profiling(true);
  reset_gemm_stats();
  forward_backward<float>(layout, params.data(), grads.data(), tokens.data(), B, 1.0f, ws, {});
  set_gemm_profiling(false);
  std::map<std::string, int64_t> calls;
  for (const GemmShapeStats& s : gemm_stats_by_shape()) calls[s.shape] = s.stats.calls;
  return calls;
}

std::map<std::string, int64_t> listed(const std::vector<GemmCall>& calls) {
  std::map<std::string, int64_t> out;
  for (const GemmCall& g : calls)
    out[std::string(g.trans_a ? "T" : "N") + (g.trans_b ? "T " : "N ") + std::to_string(g.M) + "x" + std::to_string(g.N) +
        "x" + std::to_string(g.K)] += g.count;
  return out;
}

TEST(GemmProbe, ListsTheProductsARealStepCalls) {
  Config moe = small_config();
  moe.experts = 4;
  moe.top_k = 2;
  moe.moe_every = 2;  // a dense layer and an MoE layer
  const std::tuple<const char*, Config, int, int> cases[] = {
      {"dense", small_config(), 0, 1}, {"tp shard", small_config(), 1, 2}, {"moe capacity", moe, 0, 1}};
  for (const auto& [name, cfg, tp_rank, tp] : cases) {
    const ParamLayout layout(cfg, tp_rank, tp);
    const std::vector<GemmCall> calls = step_gemm_calls(layout, 3);
    EXPECT_EQ(listed(calls), profiled_step(layout, 3)) << name;
    EXPECT_EQ(gemm_stats().flops, gemm_flops(calls)) << name;
  }
  // Dropless: the experts' split follows the routing, their FLOPs do not.
  moe.capacity_factor = 0;
  const ParamLayout layout(moe, 0, 1);
  profiled_step(layout, 3);
  EXPECT_EQ(gemm_stats().flops, gemm_flops(step_gemm_calls(layout, 3)));
}

TEST(GemmProbe, RateIsPositiveAndNeverFalls) {
  const ParamLayout layout(small_config(), 0, 1);
  GemmProbe p(layout, 3);
  EXPECT_EQ(p.gflops(), 0.0);  // nothing timed yet
  EXPECT_EQ(p.step_flops(), gemm_flops(step_gemm_calls(layout, 3)));
  const double first = p.run(0);  // every product once
  EXPECT_GT(first, 0.0);
  EXPECT_EQ(p.gflops(), first);
  // A probe with a tiny budget times one product at least: each product's best time can only
  // fall, so the rate only rises.
  const double second = p.run(1e-9);
  EXPECT_GE(second, first);
  EXPECT_EQ(p.probes(), 2);
}

}  // namespace
}  // namespace pwm::model
