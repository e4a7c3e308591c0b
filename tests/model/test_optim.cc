// AdamW, the learning-rate schedule and clipping against values computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "common/check.h"
#include "model/optim.h"
#include "model/params.h"

namespace pwm::model {
namespace {

TEST(Optim, AdamWTwoStepsByHand) {
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  const double lr = 0.01;
  float p[2] = {1.0f, -2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  const float g1[2] = {0.5f, -1.0f}, g2[2] = {-0.25f, 2.0f};
  adamw_span(c, 0, lr, 1.0, true, p, g1, m, v, 2);
  adamw_span(c, 1, lr, 1.0, true, p, g2, m, v, 2);
  for (int i = 0; i < 2; ++i) {
    // Reference in double: torch.optim.AdamW's update.
    double P = (i == 0 ? 1.0 : -2.0), M = 0, Vv = 0;
    const double G[2] = {i == 0 ? 0.5 : -1.0, i == 0 ? -0.25 : 2.0};
    for (int t = 1; t <= 2; ++t) {
      M = 0.9 * M + 0.1 * G[t - 1];
      Vv = 0.99 * Vv + 0.01 * G[t - 1] * G[t - 1];
      P *= 1 - lr * 0.1;
      const double mhat = M / (1 - std::pow(0.9, t)), vhat = Vv / (1 - std::pow(0.99, t));
      P -= lr * mhat / (std::sqrt(vhat) + 1e-8);
    }
    EXPECT_NEAR(p[i], P, 1e-6) << i;
    EXPECT_NEAR(m[i], M, 1e-7) << i;
    EXPECT_NEAR(v[i], Vv, 1e-7) << i;
  }
  // First step of Adam moves each coordinate by ~lr against the gradient's sign.
  float q = 3.0f, mq = 0, vq = 0, gq = 1e-3f;
  adamw_span(c, 0, lr, 1.0, false, &q, &gq, &mq, &vq, 1);
  EXPECT_NEAR(q, 3.0 - lr, 1e-6);
}

TEST(Optim, LearningRateSchedule) {
  AdamWConfig c;
  c.lr = 1e-3;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr_frac = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 5e-4);
  EXPECT_DOUBLE_EQ(lr_at(c, 9), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(c, 10), 1e-3);                      // cosine starts at the peak
  EXPECT_NEAR(lr_at(c, 60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-15);  // half way: cos(pi/2) = 0
  EXPECT_NEAR(lr_at(c, 35), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4))),
              1e-15);
  EXPECT_DOUBLE_EQ(lr_at(c, 110), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(c, 1000), 1e-4);
  c.total_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(c, 500), 1e-3);
  c.total_steps = 5;
  EXPECT_THROW(c.validate(), pwm::Error);
}

TEST(Optim, ClippingAndNorms) {
  AdamWConfig c;
  c.max_grad_norm = 1.0;
  const float g[4] = {3, 4, 0, 0};
  EXPECT_DOUBLE_EQ(sq_norm(g, 4), 25.0);
  EXPECT_NEAR(clip_factor(c, 25.0), 1.0 / 5.0, 1e-7);  // 1 / (5 + 1e-6)
  EXPECT_DOUBLE_EQ(clip_factor(c, 0.25), 1.0);
  c.max_grad_norm = 0;
  EXPECT_DOUBLE_EQ(clip_factor(c, 1e6), 1.0);
}

TEST(Optim, NoDecayOnNormScalesAndTpNorm) {
  Config cfg;
  cfg.d_model = 8;
  cfg.n_layers = 1;
  cfg.n_heads = 2;
  cfg.head_dim = 4;
  cfg.d_ff = 8;
  cfg.vocab = 10;
  cfg.seq_len = 4;
  AdamWConfig c;
  c.weight_decay = 0.5;
  const ParamLayout lay(cfg, 0, 1);
  std::vector<float> p(lay.total(), 1.0f), g(lay.total(), 0.0f), m(lay.total(), 0.0f),
      v(lay.total(), 0.0f);
  // Zero gradients: only the decay moves parameters. Update a range that cuts tensors.
  adamw_update(c, lay, 3, lay.total() - 2, 0, 0.1, 1.0, p.data(), g.data(), m.data(), v.data());
  for (const ParamInfo& info : lay.params())
    for (int64_t i = 0; i < info.size; ++i) {
      const int64_t k = info.offset + i;
      const bool in_range = k >= 3 && k < lay.total() - 2;
      const float want = (in_range && info.weight_decay) ? 0.95f : 1.0f;
      EXPECT_EQ(p[k], want) << info.name << "[" << i << "]";
    }
  EXPECT_FALSE(lay.get("layers.0.norm").weight_decay);
  EXPECT_FALSE(lay.get("final_norm").weight_decay);
  EXPECT_TRUE(lay.get("embed").weight_decay);

  // Global squared norm over tp: replicated tensors counted once (on rank 0).
  std::vector<float> ones(lay.total(), 1.0f);
  EXPECT_DOUBLE_EQ(grad_sq_norm_tp(lay, ones.data()), static_cast<double>(cfg.num_params()));
  double sum = 0;
  for (int r = 0; r < 2; ++r) {
    const ParamLayout l2(cfg, r, 2);
    std::vector<float> o(l2.total(), 1.0f);
    sum += grad_sq_norm_tp(l2, o.data());
  }
  EXPECT_DOUBLE_EQ(sum, static_cast<double>(cfg.num_params()));
}

}  // namespace
}  // namespace pwm::model

namespace pwm::model {
namespace {

TEST(Optim, OutOfPlaceStepEqualsInPlaceBitwise) {
  Config c;
  c.d_model = 16; c.n_layers = 1; c.n_heads = 2; c.head_dim = 8; c.d_ff = 32; c.vocab = 20; c.seq_len = 4;
  const ParamLayout layout(c, 0, 1);
  const size_t n = static_cast<size_t>(layout.total());
  std::vector<float> p(n), g(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.1f * i);
    g[i] = std::cos(0.37f * i);
    m[i] = 0.01f * std::sin(0.7f * i);
    v[i] = 0.001f * (1 + std::cos(0.3f * i));
  }
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  std::vector<float> p2(n), m2(n), v2(n);
  adamw_step_into(cfg, layout, 3, 1e-3, 0.7, p.data(), g.data(), m.data(), v.data(), p2.data(), m2.data(), v2.data());
  adamw_step(cfg, layout, 3, 1e-3, 0.7, p.data(), g.data(), m.data(), v.data());
  EXPECT_EQ(p, p2);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
}

}  // namespace
}  // namespace pwm::model
