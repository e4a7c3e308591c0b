// Activations bound to memory outside the workspace (as the Pathways chained mode keeps them in
// object-store buffers) compute exactly what the owned workspace computes.
#include <gtest/gtest.h>

#include <cstring>

#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {
namespace {

TEST(ActivationsBind, ExternalStateGivesIdenticalBits) {
  const Config c = testing::tiny_config();
  const ParamLayout layout(c, 0, 1);
  const int64_t B = 3, N = B * c.seq_len, C = c.d_model;
  const int L = static_cast<int>(c.n_layers);
  std::vector<float> params(layout.total());
  init_params(layout, c.seed, params.data());
  const auto tokens = testing::random_tokens(c, B, 11);

  Workspace<float> owned(layout, B);
  std::vector<float> g1(layout.total(), 0.f);
  const float loss1 = forward_backward<float>(layout, params.data(), g1.data(), tokens.data(), B, 1.0f, owned, {});

  // Every layer's saved state, every x(l) and dx in separate external buffers, one layer at a
  // time, as separate per-layer nodes would run.
  Workspace<float> ws(layout, B);
  auto& act = ws.act;
  const int64_t per_layer = Activations<float>::layer_elements(layout, B);
  std::vector<std::vector<float>> saved(L, std::vector<float>(per_layer, -1.f));
  std::vector<std::vector<float>> xs(L + 1, std::vector<float>(N * C, -1.f));
  std::vector<float> dx(N * C, -1.f), g2(layout.total(), 0.f);
  for (int l = 0; l < L; ++l) act.bind_layer(l, saved[l].data());
  for (int l = 0; l <= L; ++l) act.bind_x(l, xs[l].data());
  act.bind_dx(dx.data());
  embed_forward<float>(layout, params.data(), tokens.data(), act);
  for (int l = 0; l < L; ++l) block_forward<float>(layout, params.data(), l, act, ws.scratch, {});
  const float loss2 = head_forward<float>(layout, params.data(), tokens.data(), act);
  head_backward<float>(layout, params.data(), g2.data(), tokens.data(), 1.0f, act, ws.scratch);
  for (int l = L - 1; l >= 0; --l) block_backward<float>(layout, params.data(), g2.data(), l, act, ws.scratch, {});
  embed_backward<float>(layout, g2.data(), tokens.data(), act);

  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), sizeof(float) * g1.size()));
  // The state really lived outside: the external buffers were written.
  EXPECT_NE(saved[0][0], -1.f);
  EXPECT_EQ(0, std::memcmp(xs[L].data(), owned.act.x(L), sizeof(float) * N * C));
}

}  // namespace
}  // namespace pwm::model
