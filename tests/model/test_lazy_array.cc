// common/lazy_array.h, and the model's owned activations built on it: memory a run never writes
// (pathways_train's unit kernels bind the object store's buffers instead) is never resident.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>

#include <utility>

#include "common/lazy_array.h"
#include "common/memory.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm {
namespace {

TEST(LazyArray, ZeroFilledWritableReleasedPagesReadZero) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)) / sizeof(float);
  LazyArray<float> a(4 * page);
  ASSERT_EQ(a.size(), 4 * page);
  for (size_t i = 0; i < a.size(); i += 97) EXPECT_EQ(a.data()[i], 0.0f) << i;
  for (size_t i = 0; i < a.size(); ++i) a.data()[i] = static_cast<float>(i + 1);
  // [page / 2, 3 page): only page 1 and 2 lie wholly inside; the half pages keep their values.
  a.release(static_cast<int64_t>(page / 2), static_cast<int64_t>(3 * page));
  EXPECT_EQ(a.data()[page / 2], static_cast<float>(page / 2 + 1));
  EXPECT_EQ(a.data()[page - 1], static_cast<float>(page));
  EXPECT_EQ(a.data()[page], 0.0f);
  EXPECT_EQ(a.data()[3 * page - 1], 0.0f);
  EXPECT_EQ(a.data()[3 * page], static_cast<float>(3 * page + 1));
  LazyArray<float> b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data()[3 * page], static_cast<float>(3 * page + 1));
  LazyArray<float> empty(0);
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(LazyArray, ActivationsResidentOnlyWhenWritten) {
  // Activations whose saved layers are ~200 MiB: made and left alone, they add (almost) nothing
  // to the resident set (the head's buffers, a few MiB, are ordinary vectors); a forward over
  // their own memory makes the saved layers resident.
  model::Config c = model::testing::tiny_config();
  c.d_model = 64;
  c.head_dim = 16;
  c.d_ff = 256;
  c.seq_len = 128;
  c.n_layers = 4;
  const model::ParamLayout layout(c, 0, 1);
  const int64_t B = 64;
  const double saved = static_cast<double>(model::Activations<float>::layer_elements(layout, B) * c.n_layers) * sizeof(float);
  ASSERT_GT(saved, 128.0 * (1 << 20));
  std::vector<float> params(static_cast<size_t>(layout.total()));
  model::init_params(layout, c.seed, params.data());
  const auto tokens = model::testing::random_tokens(c, B, 3);
  model::Scratch<float> scratch(layout, B);
  const int64_t before = current_resident_bytes();
  ASSERT_GT(before, 0) << "no /proc/self/statm";
  model::Activations<float> act(layout, B);
  const double made = static_cast<double>(current_resident_bytes() - before);
  EXPECT_LT(made, 0.05 * saved) << "activations nobody wrote made " << made << " bytes resident of " << saved;
  model::embed_forward<float>(layout, params.data(), tokens.data(), act);
  for (int l = 0; l < static_cast<int>(c.n_layers); ++l) model::block_forward<float>(layout, params.data(), l, act, scratch, {});
  const double used = static_cast<double>(current_resident_bytes() - before);
  EXPECT_GT(used, 0.9 * saved) << "the forward wrote its saved state: " << used << " bytes resident of " << saved;
  std::printf("activations of %.0f MiB saved state: %.1f MiB resident when made, %.1f MiB after a forward\n",
              saved / (1 << 20), made / (1 << 20), used / (1 << 20));
}

}  // namespace
}  // namespace pwm
