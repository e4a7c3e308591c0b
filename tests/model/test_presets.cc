// --preset (train/presets.h): each preset's shape and parameter count, the order preset <
// --config < flags, the warm-up fitted to short runs, and the refusals.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "tests/model/parse_flags.h"
#include "train/flags.h"
#include "train/presets.h"

namespace pwm::train {
namespace {

std::string parse(std::vector<std::string> args, TrainConfig& cfg) { return testing::parse_flags(std::move(args), cfg); }

// The parameter count by hand for PaLM's block (docs/model.md): per layer one norm scale before
// the parallel attention and MLP, Wq and Wo (C x H D), one K and one V head (C x D each, multi-
// query), SwiGLU's three C x F matrices; the tied byte embedding V x C and the final norm.
int64_t by_hand(int64_t C, int64_t L, int64_t H, int64_t D, int64_t F) {
  const int64_t layer = C + 2 * C * H * D + 2 * C * D + 3 * C * F;
  return L * layer + 256 * C + C;
}

TEST(Presets, ShapesAndParameterCounts) {
  const model::Config ref;
  const Preset& p4 = find_preset("4m");
  EXPECT_EQ(preset_model(p4).num_params(), ref.num_params()) << "4m is the reference model";
  const model::Config m30 = preset_model(find_preset("30m")), m100 = preset_model(find_preset("100m"));
  EXPECT_EQ(m30.num_params(), by_hand(512, 8, 8, 64, 2048));
  EXPECT_EQ(m100.num_params(), by_hand(768, 12, 12, 64, 3072));
  EXPECT_NEAR(static_cast<double>(m30.num_params()), 30e6, 1.5e6);
  EXPECT_NEAR(static_cast<double>(m100.num_params()), 100e6, 2e6);
  for (const Preset& p : presets()) EXPECT_NO_THROW(preset_model(p).validate()) << p.name;
}

TEST(Presets, FlagsAndConfigOverrideThePreset) {
  TrainConfig a;
  ASSERT_EQ(parse({"--preset", "30m", "--steps", "100"}, a), "");
  EXPECT_EQ(a.model.d_model, 512);
  EXPECT_EQ(a.model.seq_len, 256);
  EXPECT_DOUBLE_EQ(a.optim.lr, 6e-4);
  EXPECT_EQ(a.optim.warmup_steps, 10);
  TrainConfig b;
  ASSERT_EQ(parse({"--preset=100m", "--lr", "1e-4", "--seq-len", "64", "--steps", "100"}, b), "");
  EXPECT_EQ(b.optim.warmup_steps, 20);
  EXPECT_EQ(b.model.d_model, 768);
  EXPECT_EQ(b.model.seq_len, 64);
  EXPECT_DOUBLE_EQ(b.optim.lr, 1e-4);
  const std::string path = ::testing::TempDir() + "preset_config.json";
  std::ofstream(path) << R"({"d-model": 384, "warmup-steps": 2})";
  TrainConfig c;
  ASSERT_EQ(parse({"--preset", "30m", "--config", path, "--steps", "4"}, c), "");
  EXPECT_EQ(c.model.d_model, 384);
  EXPECT_EQ(c.model.n_layers, 8);
  EXPECT_EQ(c.optim.warmup_steps, 2) << "the file's warm-up is kept";
  std::remove(path.c_str());
}

TEST(Presets, WarmupFitsShortRuns) {
  TrainConfig a;
  ASSERT_EQ(parse({"--preset", "100m", "--steps", "8"}, a), "");
  EXPECT_EQ(a.optim.warmup_steps, 4);
  EXPECT_NO_THROW(a.validate(1));
  TrainConfig b;
  ASSERT_EQ(parse({"--preset", "100m", "--steps", "8", "--warmup-steps", "6"}, b), "");
  EXPECT_EQ(b.optim.warmup_steps, 6) << "a given warm-up is kept";
}

TEST(Presets, RefusedInOneLine) {
  TrainConfig a;
  EXPECT_EQ(parse({"--preset", "50m"}, a), "--preset 50m is not a preset: use one of 4m, 30m, 100m (docs/model.md, \"Presets\")");
  const std::string path = ::testing::TempDir() + "preset_key.json";
  std::ofstream(path) << R"({"preset": "30m"})";
  TrainConfig b;
  const std::string e = parse({"--config", path}, b);
  EXPECT_NE(e.find("key 'preset' cannot be set from a config file (give --preset on the command line"), std::string::npos) << e;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pwm::train
