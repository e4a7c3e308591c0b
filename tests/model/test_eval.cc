// Evaluation helpers: checkpoint tensors -> parameter buffer (full and tp shard) and the loss of
// a byte string, against forward_loss run by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "model/params.h"
#include "model/transformer.h"

namespace pwm::model {

using namespace ::pwm::train;  // the trainers' toolkit (train/)
namespace {

Config byte_config() {
  Config c;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.head_dim = 8;
  c.d_ff = 32;
  c.vocab = 256;
  c.seq_len = 16;
  c.seed = 3;
  return c;
}

Checkpoint checkpoint_of(const Config& c, const std::vector<float>& params, const ParamLayout& lay) {
  Checkpoint ck;
  ck.config = c;
  for (const ParamInfo& p : lay.params())
    ck.params.push_back({p.name, p.full_shape,
                         std::vector<float>(params.begin() + p.offset,
                                            params.begin() + p.offset + p.size)});
  return ck;
}

TEST(Eval, CheckpointRoundTripAndShards) {
  const Config c = byte_config();
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total());
  init_params(lay, c.seed, p.data());
  const std::string path = ::testing::TempDir() + "pwm_eval_test.ckpt";
  save_checkpoint(path, checkpoint_of(c, p, lay));
  const Checkpoint ck = load_checkpoint(path);
  std::remove(path.c_str());
  EXPECT_EQ(params_from_checkpoint(ck, lay), p);
  // A tp shard loaded from the full tensors equals that shard's own init.
  const ParamLayout shard(c, 1, 2);
  std::vector<float> ps(shard.total());
  init_params(shard, c.seed, ps.data());
  EXPECT_EQ(params_from_checkpoint(ck, shard), ps);
  // A wrong shape is named.
  Checkpoint bad = ck;
  bad.params[1].shape = {17};
  EXPECT_THROW(params_from_checkpoint(bad, lay), pwm::Error);
}

TEST(Eval, LossOfBytesMatchesForwardLoss) {
  const Config c = byte_config();
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total());
  init_params(lay, c.seed, p.data());
  std::string text;
  for (int i = 0; i < 5 * 16 + 7; ++i) text.push_back(static_cast<char>("the cat sat. "[i % 13]));
  const EvalResult r = evaluate_bytes(lay, p.data(), text, 2);  // batches of 2, 2, 1 windows
  EXPECT_EQ(r.windows, 5);
  EXPECT_EQ(r.tokens, 80);
  // By hand: all 5 windows in one batch.
  std::vector<int32_t> tok(5 * 17);
  for (int w = 0; w < 5; ++w)
    for (int t = 0; t <= 16; ++t) tok[w * 17 + t] = static_cast<unsigned char>(text[w * 16 + t]);
  Workspace<float> ws(lay, 5);
  const float loss = forward_loss<float>(lay, p.data(), tok.data(), 5, ws, {});
  EXPECT_NEAR(r.loss, loss, 1e-5);
  EXPECT_LT(r.xent, r.loss);                 // the z-loss term is positive
  EXPECT_NEAR(r.xent, std::log(256.0), 1.0);  // an untrained model is near uniform
  EXPECT_THROW(evaluate_bytes(lay, p.data(), std::string(16, 'a'), 2), pwm::Error);
}

// pwm_eval --precise prints the losses so that they round-trip: the tool's figures are the
// library's doubles exactly.
TEST(Eval, ToolPrecisePrintsTheExactLoss) {
  const Config c = byte_config();
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total());
  init_params(lay, c.seed, p.data());
  const std::string ckpt = ::testing::TempDir() + "pwm_eval_tool.ckpt", text = ::testing::TempDir() + "pwm_eval_tool.txt";
  save_checkpoint(ckpt, checkpoint_of(c, p, lay));
  std::string bytes;
  for (int i = 0; i < 6 * 16 + 1; ++i) bytes.push_back(static_cast<char>("a quick brown fox "[i % 18]));
  std::FILE* f = std::fopen(text.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  const EvalResult r = evaluate_bytes(lay, p.data(), bytes, 8);
  const std::string cmd = std::string(PWM_EVAL_TOOL) + " --precise --checkpoint " + ckpt + " --text " + text;
  std::FILE* out = ::popen(cmd.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string all;
  for (char buf[512]; std::fgets(buf, sizeof(buf), out);) all += buf;
  EXPECT_EQ(::pclose(out), 0) << all;
  std::remove(ckpt.c_str());
  std::remove(text.c_str());
  const size_t at = all.find("xent ");
  ASSERT_NE(at, std::string::npos) << all;
  EXPECT_EQ(std::strtod(all.c_str() + at + 5, nullptr), r.xent) << all;
  const size_t z = all.find("loss with z-loss ");
  ASSERT_NE(z, std::string::npos) << all;
  EXPECT_EQ(std::strtod(all.c_str() + z + 17, nullptr), r.loss) << all;
}

}  // namespace
}  // namespace pwm::model
