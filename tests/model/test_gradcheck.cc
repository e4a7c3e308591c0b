// Finite-difference check of the hand-written backward, in double precision.
//
// Central differences with step h = 1e-5: truncation error ~ h^2 |f'''| / 6 ~ 1e-11 and rounding
// error ~ 1e-16 |loss| / h ~ 1e-10 for a loss of ~3, while the gradients checked are ~1e-4..1e-1.
// So we require |fd - analytic| <= 1e-8 + 1e-6 |analytic|: a wrong term (a missing factor, a
// transposed index, a dropped z-loss or rope term) misses it by orders of magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {
namespace {

constexpr double kStep = 1e-5;
constexpr double kAtol = 1e-8;
constexpr double kRtol = 1e-6;

struct GradCheckModel {
  explicit GradCheckModel(const Config& cfg, int64_t B_ = 2)
      : layout(cfg, 0, 1), B(B_), ws(layout, B_), params(layout.total()) {
    init_params(layout, cfg.seed, params.data());
    // Move away from the init's special values (norm scales all 1) so every term matters.
    std::mt19937 rng(11);
    std::normal_distribution<double> noise(0.0, 0.1);
    for (auto& p : params) p += noise(rng);
    tokens = testing::random_tokens(cfg, B, 3);
    tokens[1] = tokens[0];  // a repeated input token: its embedding row accumulates twice
  }
  double loss() { return forward_loss<double>(layout, params.data(), tokens.data(), B, ws, {}); }
  std::vector<double> grads() {
    std::vector<double> g(layout.total(), 0.0);
    forward_backward<double>(layout, params.data(), g.data(), tokens.data(), B, 1.0, ws, {});
    return g;
  }
  ParamLayout layout;
  int64_t B;
  Workspace<double> ws;
  std::vector<double> params;
  std::vector<int32_t> tokens;
};

void check_every_tensor(const Config& cfg) {
  GradCheckModel m(cfg);
  const std::vector<double> g = m.grads();
  std::mt19937 rng(5);
  int checked = 0;
  for (const ParamInfo& p : m.layout.params()) {
    std::vector<int64_t> idx;
    if (p.kind == ParamKind::kEmbed) {
      // Rows looked up as inputs (lookup + output projection) and rows only used as outputs.
      for (int k = 0; k < 4; ++k) idx.push_back(m.tokens[k] * cfg.d_model + k);
      idx.push_back(m.tokens[0] * cfg.d_model + 3);
    }
    std::uniform_int_distribution<int64_t> pick(0, p.size - 1);
    for (int k = 0; k < 8; ++k) idx.push_back(pick(rng));
    for (int64_t i : idx) {
      double& x = m.params[p.offset + i];
      const double saved = x;
      x = saved + kStep;
      const double up = m.loss();
      x = saved - kStep;
      const double down = m.loss();
      x = saved;
      const double fd = (up - down) / (2 * kStep);
      const double an = g[p.offset + i];
      EXPECT_NEAR(fd, an, kAtol + kRtol * std::abs(an)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(GradCheck, EveryParameterKindLayerNorm) { check_every_tensor(testing::tiny_config()); }

TEST(GradCheck, EveryParameterKindRmsNorm) {
  Config c = testing::tiny_config();
  c.norm = NormKind::kRmsNorm;
  check_every_tensor(c);
}

// T = 40 spans two causal query blocks of the attention (32 + 8 rows of t).
TEST(GradCheck, SequenceLongerThanOneAttentionBlock) {
  Config c = testing::tiny_config();
  c.seq_len = 40;
  check_every_tensor(c);
}

// The embedding lookup in isolation: the gradient w.r.t. the block stack's input x(0), as left in
// act.dx() by the backward just before embed_backward, against finite differences of x(0); then
// embed_backward must scatter exactly those rows into grads["embed"].
TEST(GradCheck, EmbeddingLookup) {
  const Config cfg = testing::tiny_config();
  GradCheckModel m(cfg);
  const ParamLayout& lay = m.layout;
  const int L = static_cast<int>(cfg.n_layers);
  Activations<double> act(lay, m.B);
  Scratch<double> sc(lay, m.B);
  auto loss_from_x0 = [&]() {
    for (int l = 0; l < L; ++l) block_forward<double>(lay, m.params.data(), l, act, sc, {});
    return head_forward<double>(lay, m.params.data(), m.tokens.data(), act);
  };
  std::vector<double> g(lay.total(), 0.0);
  embed_forward<double>(lay, m.params.data(), m.tokens.data(), act);
  loss_from_x0();
  head_backward<double>(lay, m.params.data(), g.data(), m.tokens.data(), 1.0, act, sc);
  for (int l = L - 1; l >= 0; --l) block_backward<double>(lay, m.params.data(), g.data(), l, act, sc, {});
  const int64_t NC = act.N() * cfg.d_model;
  const std::vector<double> dx0(act.dx(), act.dx() + NC);

  std::vector<double> x0(act.x(0), act.x(0) + NC);
  for (int64_t i = 0; i < NC; i += 7) {
    std::copy(x0.begin(), x0.end(), act.x(0));
    act.x(0)[i] = x0[i] + kStep;
    const double up = loss_from_x0();
    std::copy(x0.begin(), x0.end(), act.x(0));
    act.x(0)[i] = x0[i] - kStep;
    const double down = loss_from_x0();
    EXPECT_NEAR((up - down) / (2 * kStep), dx0[i], kAtol + kRtol * std::abs(dx0[i])) << i;
  }

  std::vector<double> ge(lay.total(), 0.0), expect(lay.total(), 0.0);
  embed_backward<double>(lay, ge.data(), m.tokens.data(), act);
  const int64_t T = cfg.seq_len, C = cfg.d_model;
  for (int64_t b = 0; b < m.B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c)
        expect[m.tokens[b * (T + 1) + t] * C + c] += dx0[(b * T + t) * C + c];
  EXPECT_EQ(ge, expect);
}

// grads accumulate: two calls with grad_scale 0.5 and 0.25 give 0.75 x one call (in double, to
// rounding).
TEST(GradCheck, GradScaleAccumulates) {
  GradCheckModel m(testing::tiny_config());
  const std::vector<double> g1 = m.grads();
  std::vector<double> g(m.layout.total(), 0.0);
  forward_backward<double>(m.layout, m.params.data(), g.data(), m.tokens.data(), m.B, 0.5, m.ws, {});
  forward_backward<double>(m.layout, m.params.data(), g.data(), m.tokens.data(), m.B, 0.25, m.ws, {});
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 0.75 * g1[i], 1e-14 + 1e-12 * std::abs(g1[i]));
}

}  // namespace
}  // namespace pwm::model
