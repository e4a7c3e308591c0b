// Checkpoint files: bitwise round trip, refusal of truncated / corrupted / foreign files, config
// compatibility messages, atomic writes, and an independent Python reader that must agree.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "train/checkpoint.h"
#include "tests/model/temp_dir.h"

namespace pwm::model {

using namespace ::pwm::train;  // the trainers' toolkit (train/)
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

using testing::error_of;

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TensorData tensor(const std::string& name, std::vector<int64_t> shape, float scale) {
  TensorData t{name, std::move(shape), {}};
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    t.values.push_back(scale * std::sin(static_cast<float>(i) * 0.37f + scale));
  return t;
}

// A small checkpoint exercising the corners: a scalar, an empty tensor, an odd size that
// forces alignment padding, and special values (signed zero, denormal, inf, NaN with payload).
Checkpoint sample() {
  Checkpoint c;
  c.config.d_model = 32;
  c.config.n_layers = 2;
  c.config.n_heads = 2;
  c.config.head_dim = 16;
  c.config.d_ff = 96;
  c.config.seq_len = 24;
  c.config.z_loss = 3.25e-5;
  c.config.rope_base = 500000.0;
  c.config.norm = NormKind::kRmsNorm;
  c.config.seed = 0xFEDCBA9876543210ULL;
  c.step = 1234;
  c.train_config_json = R"({"lr": 0.001, "batch": 8, "note": "quotes \" and\nnewline, ü"})";
  c.params = {tensor("wte", {256, 32}, 0.02f), tensor("layer0.norm", {32}, 1.0f),
              tensor("odd", {3, 5, 7}, 0.5f), tensor("scalar", {}, 2.0f),
              tensor("empty", {0, 4}, 1.0f)};
  auto& odd = c.params[2].values;
  odd[0] = -0.0f;
  odd[1] = std::numeric_limits<float>::denorm_min();
  odd[2] = std::numeric_limits<float>::infinity();
  odd[3] = -std::numeric_limits<float>::infinity();
  odd[4] = from_bits(0x7FC12345u);  // NaN with a payload
  odd[5] = std::numeric_limits<float>::max();
  for (const auto& p : c.params) {
    c.adam_m.push_back(tensor(p.name, p.shape, 1e-3f));
    c.adam_v.push_back(tensor(p.name, p.shape, 1e-6f));
  }
  return c;
}

void expect_bitwise_equal(const std::vector<TensorData>& a, const std::vector<TensorData>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    ASSERT_EQ(a[i].values.size(), b[i].values.size()) << a[i].name;
    if (!a[i].values.empty()) {  // (an empty vector's data() may be null: memcmp's UB)
      EXPECT_EQ(std::memcmp(a[i].values.data(), b[i].values.data(), a[i].values.size() * 4), 0)
          << a[i].name;
    }
  }
}

TEST(CheckpointFormat, Crc32MatchesZlib) {
  const char* s = "123456789";
  EXPECT_EQ(checkpoint_crc32(0, s, 9), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(checkpoint_crc32(checkpoint_crc32(0, s, 4), s + 4, 5), 0xCBF43926u);
  EXPECT_EQ(checkpoint_crc32(0, s, 0), 0u);
  std::string long_text(1000, '\0');
  for (size_t i = 0; i < long_text.size(); ++i) long_text[i] = static_cast<char>(i * 7 + 3);
  uint32_t bytewise = 0;
  for (char c : long_text) bytewise = checkpoint_crc32(bytewise, &c, 1);
  EXPECT_EQ(checkpoint_crc32(0, long_text.data(), long_text.size()), bytewise);
}

TEST(CheckpointFile, RoundTripIsBitwise) {
  TempDir dir;
  const Checkpoint c = sample();
  const std::string path = dir.file("a.ckpt");
  save_checkpoint(path, c);
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"a.ckpt"});  // no temporary left behind
  const Checkpoint r = load_checkpoint(path);
  EXPECT_EQ(r.path, path);
  EXPECT_TRUE(r.config == c.config) << r.config.to_string();
  EXPECT_EQ(r.step, c.step);
  EXPECT_EQ(r.train_config_json, c.train_config_json);
  expect_bitwise_equal(r.params, c.params);
  expect_bitwise_equal(r.adam_m, c.adam_m);
  expect_bitwise_equal(r.adam_v, c.adam_v);
  EXPECT_EQ(to_bits(r.param("odd").values[4]), 0x7FC12345u);
  EXPECT_EQ(r.m("wte").values, c.adam_m[0].values);
  EXPECT_EQ(r.v("wte").values, c.adam_v[0].values);

  // Saving what was loaded reproduces the file byte for byte, and overwriting works.
  save_checkpoint(path, r);
  const std::string first = read_bytes(path);
  save_checkpoint(dir.file("b.ckpt"), r);
  EXPECT_EQ(read_bytes(dir.file("b.ckpt")), first);
  EXPECT_EQ(first.size() % 4, 0u);
}

TEST(CheckpointFile, WithoutOptimizerState) {
  TempDir dir;
  Checkpoint c = sample();
  c.adam_m.clear();
  c.adam_v.clear();
  save_checkpoint(dir.file("p.ckpt"), c);
  const Checkpoint r = load_checkpoint(dir.file("p.ckpt"));
  EXPECT_FALSE(r.has_optimizer_state());
  expect_bitwise_equal(r.params, c.params);
}

// Issue 42: the file stores non-finite values bit for bit (above), but a run does not resume
// from them: check_finite names the file, the tensor and the element.
TEST(CheckpointFinite, NonFiniteParametersAndMomentsAreNamed) {
  TempDir dir;
  Checkpoint c = sample();
  save_checkpoint(dir.file("nan.ckpt"), c);
  const Checkpoint r = load_checkpoint(dir.file("nan.ckpt"));
  EXPECT_NE(error_of([&] { check_finite(r, false); })
                .find("checkpoint " + dir.file("nan.ckpt") + " holds a non-finite value (inf) in parameter odd, element 2"),
            std::string::npos);
  c.params[2].values = std::vector<float>(c.params[2].values.size(), 0.5f);
  EXPECT_NO_THROW(check_finite(c, true));
  c.adam_v[3].values[0] = from_bits(0xFFC00000u);  // a negative NaN
  EXPECT_NO_THROW(check_finite(c, false));         // (the parameters alone: pwm_eval)
  EXPECT_NE(error_of([&] { check_finite(c, true); }).find("(nan) in AdamW second moment scalar, element 0"),
            std::string::npos);
}

TEST(CheckpointFile, TruncatedFileIsRefused) {
  TempDir dir;
  const std::string good = dir.file("good.ckpt");
  save_checkpoint(good, sample());
  const std::string bytes = read_bytes(good);
  const std::string bad = dir.file("bad.ckpt");
  for (size_t len : {size_t{0}, size_t{5}, size_t{8}, size_t{31}, size_t{35}, size_t{100},
                     bytes.size() / 2, bytes.size() - 5, bytes.size() - 4, bytes.size() - 1}) {
    write_bytes(bad, bytes.substr(0, len));
    const std::string e = error_of([&] { load_checkpoint(bad); });
    EXPECT_NE(e.find("checkpoint " + bad + ": truncated"), std::string::npos)
        << "length " << len << ": " << e;
  }
  write_bytes(bad, bytes + "x");
  EXPECT_NE(error_of([&] { load_checkpoint(bad); }).find("1 unexpected bytes"), std::string::npos);
}

// Flipping any single bit of the file - preamble, header, padding, data or checksum - is caught.
TEST(CheckpointFile, EveryBitFlipIsRefused) {
  TempDir dir;
  Checkpoint c = sample();
  c.params.resize(3);  // keep the file small: every byte is flipped once
  c.adam_m.resize(3);
  c.adam_v.resize(3);
  c.params[0] = tensor("wte", {8, 8}, 0.02f);
  c.adam_m[0] = tensor("wte", {8, 8}, 1e-3f);
  c.adam_v[0] = tensor("wte", {8, 8}, 1e-6f);
  const std::string good = dir.file("good.ckpt");
  save_checkpoint(good, c);
  const std::string bytes = read_bytes(good);
  const std::string bad = dir.file("bad.ckpt");
  write_bytes(bad, bytes);
  std::fstream f(bad, std::ios::binary | std::ios::in | std::ios::out);
  auto put = [&](size_t i, char c) {
    f.seekp(static_cast<std::streamoff>(i));
    f.put(c);
    f.flush();
  };
  int refused = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    put(i, static_cast<char>(bytes[i] ^ (1 << (i % 8))));
    const std::string e = error_of([&] { load_checkpoint(bad); });
    put(i, bytes[i]);
    ASSERT_NE(e.find("checkpoint " + bad + ": "), std::string::npos) << "byte " << i << ": " << e;
    ++refused;
  }
  EXPECT_NO_THROW(load_checkpoint(bad));  // restored: the control
  EXPECT_EQ(refused, static_cast<int>(bytes.size()));
  // The message says what is wrong where it can.
  std::string flipped = bytes;
  flipped[bytes.size() - 10] ^= 1;  // inside the last tensor
  write_bytes(bad, flipped);
  EXPECT_NE(error_of([&] { load_checkpoint(bad); }).find("checksum mismatch"), std::string::npos);
  flipped = bytes;
  flipped[bytes.size() - 1] ^= 0x80;  // the checksum itself
  write_bytes(bad, flipped);
  EXPECT_NE(error_of([&] { load_checkpoint(bad); }).find("checksum mismatch"), std::string::npos);
}

// Rewrites the version field and fixes the CRC, so that only the version is wrong.
std::string with_version(std::string bytes, uint32_t version) {
  std::memcpy(bytes.data() + 8, &version, 4);
  const uint32_t crc = checkpoint_crc32(0, bytes.data(), bytes.size() - 4);
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  return bytes;
}

TEST(CheckpointFile, WrongMagicOrVersionIsRefused) {
  TempDir dir;
  const std::string good = dir.file("good.ckpt");
  save_checkpoint(good, sample());
  const std::string bytes = read_bytes(good);
  const std::string bad = dir.file("bad.ckpt");

  write_bytes(bad, "GGUF" + bytes.substr(4));
  EXPECT_NE(error_of([&] { load_checkpoint(bad); }).find(bad + ": not a pwm checkpoint (bad magic"),
            std::string::npos);
  write_bytes(bad, "hello, world\n");
  EXPECT_NE(error_of([&] { load_checkpoint(bad); }).find("bad magic"), std::string::npos);

  write_bytes(bad, with_version(bytes, 2));
  EXPECT_NE(error_of([&] { load_checkpoint(bad); })
                .find(bad + ": format version 2, but this build reads version 1"),
            std::string::npos);
  write_bytes(bad, with_version(bytes, kCheckpointVersion));  // the control: still loads
  EXPECT_NO_THROW(load_checkpoint(bad));

  EXPECT_NE(error_of([&] { load_checkpoint(dir.file("missing.ckpt")); })
                .find("missing.ckpt: cannot open: No such file or directory"),
            std::string::npos);
}

TEST(CheckpointCompat, ConfigMismatchNamesTheFirstDifferingField) {
  TempDir dir;
  const std::string path = dir.file("x.ckpt");
  save_checkpoint(path, sample());
  const Checkpoint c = load_checkpoint(path);
  EXPECT_NO_THROW(check_compatible(c, sample().config));

  Config other = sample().config;
  other.d_model = 256;
  EXPECT_EQ(error_of([&] { check_compatible(c, other); }),
            "checkpoint " + path +
                " was written for d_model=32 but this run has d_model=256; resume with the "
                "checkpoint's model config or start a new run");
  other = sample().config;
  other.norm = NormKind::kLayerNorm;
  other.seed = 1;  // a later field: the first difference is reported
  EXPECT_NE(error_of([&] { check_compatible(c, other); })
                .find("written for norm=rmsnorm but this run has norm=layernorm"),
            std::string::npos);
  other = sample().config;
  other.z_loss = 1e-4;
  EXPECT_NE(error_of([&] { check_compatible(c, other); })
                .find("written for z_loss=3.25e-05 but this run has z_loss=0.0001"),
            std::string::npos);
}

TEST(CheckpointCompat, MissingTensorNamesTheCheckpoint) {
  TempDir dir;
  save_checkpoint(dir.file("x.ckpt"), sample());
  const Checkpoint c = load_checkpoint(dir.file("x.ckpt"));
  EXPECT_NE(error_of([&] { c.param("nope"); }).find(dir.file("x.ckpt") + " has no parameter 'nope'"),
            std::string::npos);
}

TEST(CheckpointWrite, UnwritablePathIsAClearErrorAndLeavesNoFile) {
  TempDir dir;
  // Parent directory missing.
  const std::string missing = dir.file("no/such/dir/x.ckpt");
  std::string e = error_of([&] { save_checkpoint(missing, sample()); });
  EXPECT_NE(e.find("checkpoint " + missing + ": cannot create"), std::string::npos) << e;
  // Parent is a regular file.
  write_bytes(dir.file("plain"), "not a directory");
  e = error_of([&] { save_checkpoint(dir.file("plain/x.ckpt"), sample()); });
  EXPECT_NE(e.find("Not a directory"), std::string::npos) << e;
  // The target is a directory: the data is written, the rename fails, the temporary is removed.
  fs::create_directory(dir.path() / "taken");
  e = error_of([&] { save_checkpoint(dir.file("taken"), sample()); });
  EXPECT_NE(e.find("cannot rename"), std::string::npos) << e;
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"plain", "taken"}));
  EXPECT_TRUE(fs::is_empty(dir.path() / "taken"));
}

TEST(CheckpointWrite, MalformedTensorsAreRefusedBeforeWriting) {
  TempDir dir;
  const std::string path = dir.file("x.ckpt");
  save_checkpoint(path, sample());
  const std::string before = read_bytes(path);

  Checkpoint c = sample();
  c.params[1].values.pop_back();
  std::string e = error_of([&] { save_checkpoint(path, c); });
  EXPECT_NE(e.find("params tensor 'layer0.norm' has shape [32] (32 values) but holds 31 values"),
            std::string::npos)
      << e;
  c = sample();
  c.adam_v[2].name = "renamed";
  e = error_of([&] { save_checkpoint(path, c); });
  EXPECT_NE(e.find("adam_v tensor 2 is 'renamed'"), std::string::npos) << e;
  c = sample();
  c.params.push_back(c.params[0]);
  e = error_of([&] { save_checkpoint(path, c); });
  EXPECT_NE(e.find("'wte' appears twice"), std::string::npos) << e;

  EXPECT_EQ(read_bytes(path), before);  // the previous checkpoint is untouched
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"x.ckpt"});
}

// ---- The independent Python reader -------------------------------------------------------

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CheckpointPython, IndependentReaderAgreesWithTheWriter) {
  const std::string python = PWM_PYTHON3;
  if (python.empty() || python.ends_with("NOTFOUND")) GTEST_SKIP() << "python3 not found";
  TempDir dir;
  const Checkpoint c = sample();
  const std::string path = dir.file("x.ckpt"), dump = dir.file("dump.json"),
                    log = dir.file("log.txt");
  save_checkpoint(path, c);
  const std::string cmd =
      fmt::format("'{}' '{}' '{}' --dump '{}' > '{}' 2>&1", python, PWM_READ_CHECKPOINT_PY, path,
                  dump, log);
  ASSERT_EQ(run(cmd), 0) << cmd << "\n" << read_bytes(log);

  const auto j = nlohmann::json::parse(read_bytes(dump));
  EXPECT_EQ(j.at("step").get<int64_t>(), c.step);
  EXPECT_EQ(j.at("train_config").get<std::string>(), c.train_config_json);
  const auto& cfg = j.at("config");
  EXPECT_EQ(cfg.at("d_model").get<int64_t>(), c.config.d_model);
  EXPECT_EQ(cfg.at("d_ff").get<int64_t>(), c.config.d_ff);
  EXPECT_EQ(cfg.at("z_loss").get<double>(), c.config.z_loss);
  EXPECT_EQ(cfg.at("rope_base").get<double>(), c.config.rope_base);
  EXPECT_EQ(cfg.at("norm").get<std::string>(), "rmsnorm");
  EXPECT_EQ(cfg.at("seed").get<uint64_t>(), c.config.seed);

  std::vector<std::pair<std::string, const TensorData*>> expected;
  for (const auto& t : c.params) expected.emplace_back("params", &t);
  for (const auto& t : c.adam_m) expected.emplace_back("adam_m", &t);
  for (const auto& t : c.adam_v) expected.emplace_back("adam_v", &t);
  const auto& tensors = j.at("tensors");
  ASSERT_EQ(tensors.size(), expected.size());
  size_t compared = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [group, t] = expected[i];
    const auto& pt = tensors[i];
    EXPECT_EQ(pt.at("group").get<std::string>(), group);
    EXPECT_EQ(pt.at("name").get<std::string>(), t->name);
    EXPECT_EQ(pt.at("shape").get<std::vector<int64_t>>(), t->shape);
    const auto bits = pt.at("bits").get<std::vector<uint32_t>>();
    const auto values = pt.at("values").get<std::vector<std::string>>();
    ASSERT_EQ(bits.size(), t->values.size()) << t->name;
    ASSERT_EQ(values.size(), t->values.size()) << t->name;
    for (size_t k = 0; k < bits.size(); ++k) {
      ASSERT_EQ(bits[k], to_bits(t->values[k])) << group << " " << t->name << "[" << k << "]";
      // Python decoded the float itself (struct '<f'); its value must be ours.
      const float v = std::strtof(values[k].c_str(), nullptr);
      if (std::isnan(t->values[k])) {
        ASSERT_TRUE(std::isnan(v)) << values[k];
      } else {
        ASSERT_EQ(v, t->values[k]) << group << " " << t->name << "[" << k << "] " << values[k];
        ASSERT_EQ(std::signbit(v), std::signbit(t->values[k]));
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 8000u);

  // The reader refuses what the C++ loader refuses.
  std::string bytes = read_bytes(path);
  bytes[bytes.size() / 2] ^= 0x10;
  write_bytes(dir.file("flipped.ckpt"), bytes);
  EXPECT_EQ(run(fmt::format("'{}' '{}' '{}' > '{}' 2>&1", python, PWM_READ_CHECKPOINT_PY,
                            dir.file("flipped.ckpt"), log)),
            1);
  EXPECT_NE(read_bytes(log).find("checksum mismatch"), std::string::npos) << read_bytes(log);
  write_bytes(dir.file("short.ckpt"), read_bytes(path).substr(0, 1000));
  EXPECT_EQ(run(fmt::format("'{}' '{}' '{}' > '{}' 2>&1", python, PWM_READ_CHECKPOINT_PY,
                            dir.file("short.ckpt"), log)),
            1);
}

}  // namespace
}  // namespace pwm::model
