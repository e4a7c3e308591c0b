// Tensor parallelism simulated in one process: tp ranks run as lockstep threads whose
// tp_allreduce sums the partials across the shards (SimTpGroup). The sharded forward and backward
// must equal the unsharded model; init of a shard must be the slice of the full init bitwise.
//
// Float tolerance: sharding only changes the summation order of the K dimension of the
// out-projection GEMM and of d(h) (a partial per shard, then summed). Each value differs by a few
// ulps of the terms summed, so we require |sharded - full| <= 2e-5 * max|full| per tensor (float
// eps is 1.2e-7; ~100x headroom for the accumulation across layers), and 1e-5 relative on the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {
namespace {

Config tp_config() {
  Config c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.head_dim = 8;
  c.d_ff = 64;
  c.vocab = 40;
  c.seq_len = 8;
  c.z_loss = 1e-3;
  c.seed = 99;
  return c;
}

TEST(TensorParallel, LayoutShapesAndOrder) {
  const Config c = tp_config();
  const ParamLayout full(c, 0, 1);
  EXPECT_EQ(full.total(), c.num_params());
  EXPECT_EQ(full.params().front().name, "embed");
  EXPECT_EQ(full.params().back().name, "final_norm");
  EXPECT_EQ(full.get("layers.1.wq").full_shape, (std::vector<int64_t>{32, 32}));
  for (int tp : {2, 4}) {
    int64_t replicated = 0, sharded = 0;
    const ParamLayout lay(c, 1, tp);
    for (const ParamInfo& p : lay.params()) (p.replicated() ? replicated : sharded) += p.size;
    EXPECT_EQ(replicated + tp * sharded, c.num_params());
    const ParamInfo& wq = lay.get("layers.0.wq");
    EXPECT_EQ(wq.shard_shape[0], c.n_heads * c.head_dim / tp);
    EXPECT_EQ(wq.full_offset, wq.size);  // rank 1's rows follow rank 0's
    int prev_layer = -1;
    for (const ParamInfo& p : lay.params()) {  // ordered by layer, offsets contiguous
      EXPECT_GE(p.layer, prev_layer);
      prev_layer = p.layer;
    }
  }
  EXPECT_EQ(Config{}.num_params(), 3867904);
  EXPECT_EQ(ParamLayout(Config{}, 0, 1).total(), 3867904);
}

TEST(TensorParallel, InitShardIsSliceOfFullInit) {
  const Config c = tp_config();
  const ParamLayout full(c, 0, 1);
  std::vector<float> pf(full.total());
  init_params(full, c.seed, pf.data());
  for (int tp : {2, 4})
    for (int r = 0; r < tp; ++r) {
      const ParamLayout lay(c, r, tp);
      std::vector<float> ps(lay.total());
      init_params(lay, c.seed, ps.data());
      for (const ParamInfo& p : lay.params()) {
        const ParamInfo& f = full.get(p.name);
        EXPECT_EQ(0, std::memcmp(ps.data() + p.offset, pf.data() + f.offset + p.full_offset,
                                 sizeof(float) * p.size))
            << p.name << " tp=" << tp << " rank=" << r;
      }
    }
  // A different seed gives different values.
  std::vector<float> other(full.total());
  init_params(full, c.seed + 1, other.data());
  EXPECT_NE(pf, other);
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(std::abs(a[i])));
  return m;
}

void check_tp(int tp) {
  const Config c = tp_config();
  const int64_t B = 3;
  const auto tokens = testing::random_tokens(c, B, 17);
  const ParamLayout full(c, 0, 1);
  std::vector<float> pf(full.total()), gf(full.total(), 0.0f);
  init_params(full, c.seed, pf.data());
  Workspace<float> wsf(full, B);
  const float loss_full =
      forward_backward<float>(full, pf.data(), gf.data(), tokens.data(), B, 1.0f, wsf, {});

  std::vector<ParamLayout> lays;
  for (int r = 0; r < tp; ++r) lays.emplace_back(c, r, tp);
  std::vector<std::vector<float>> ps(tp), gs(tp);
  std::vector<float> losses(tp), eval_losses(tp);
  testing::SimTpGroup<float> group(tp);
  group.run([&](int r) {
    ps[r].resize(lays[r].total());
    gs[r].assign(lays[r].total(), 0.0f);
    init_params(lays[r], c.seed, ps[r].data());
    Workspace<float> ws(lays[r], B);
    losses[r] = forward_backward<float>(lays[r], ps[r].data(), gs[r].data(), tokens.data(), B,
                                        1.0f, ws, group.callback(r));
    eval_losses[r] = forward_loss<float>(lays[r], ps[r].data(), tokens.data(), B, ws,
                                         group.callback(r));
  });

  for (int r = 0; r < tp; ++r) {
    EXPECT_NEAR(losses[r], loss_full, 1e-5 * std::abs(loss_full)) << "rank " << r;
    EXPECT_EQ(losses[r], losses[0]);
    EXPECT_EQ(eval_losses[r], losses[r]);
  }
  for (const ParamInfo& f : full.params()) {
    // Gather the full gradient tensor from the shards; replicated ones must agree bitwise.
    std::vector<float> gathered(f.full_size);
    for (int r = 0; r < tp; ++r) {
      const ParamInfo& p = lays[r].get(f.name);
      if (p.replicated()) {
        if (r == 0) std::copy_n(gs[0].data() + p.offset, p.size, gathered.data());
        EXPECT_EQ(0, std::memcmp(gs[r].data() + p.offset, gathered.data(), sizeof(float) * p.size))
            << f.name << ": replicated gradient differs on tp rank " << r;
      } else {
        std::copy_n(gs[r].data() + p.offset, p.size, gathered.data() + p.full_offset);
      }
    }
    const float* want = gf.data() + f.offset;
    const double tol = 2e-5 * max_abs(want, f.size);
    double worst = 0;
    for (int64_t i = 0; i < f.full_size; ++i)
      worst = std::max(worst, static_cast<double>(std::abs(gathered[i] - want[i])));
    EXPECT_LE(worst, tol) << f.name << " tp=" << tp;
  }
}

TEST(TensorParallel, Tp2EqualsUnsharded) { check_tp(2); }
TEST(TensorParallel, Tp4EqualsUnsharded) { check_tp(4); }

}  // namespace
}  // namespace pwm::model
