// Fuzz target: the checkpoint reader (train::parse_checkpoint, what load_checkpoint runs on the
// file's bytes). The input is a checkpoint without its 4-byte CRC trailer: the target appends
// the right CRC, so mutations reach the header and tensor checks behind the checksum instead of
// stopping at it (a wrong CRC is one comparison, covered by tests/model/test_checkpoint.cc).
// A checkpoint that parses must hold what its shapes promise.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "common/check.h"
#include "train/checkpoint.h"
#include "tests/fuzz/fuzz.h"

using namespace pwm::model;
using namespace pwm::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<unsigned char> f(data, data + size);
  const uint32_t crc = checkpoint_crc32(0, f.data(), f.size());
  f.resize(size + 4);
  std::memcpy(f.data() + size, &crc, 4);  // little-endian, as the format stores it
  Checkpoint c;
  try {
    c = parse_checkpoint(f, "checkpoint fuzz.ckpt");
  } catch (const pwm::Error&) {
    return 0;  // rejected with one clear error: what load_checkpoint promises
  }
  for (const auto* g : {&c.params, &c.adam_m, &c.adam_v})
    for (const auto& t : *g)
      if (t.numel() != static_cast<int64_t>(t.values.size())) pwm_fuzz_fail("tensor " + t.name + ": shape and values disagree");
  return 0;
}

std::vector<std::pair<std::string, std::string>> pwm_fuzz_seeds() {
  auto tensor = [](const std::string& name, std::vector<int64_t> shape, float v0) {
    TensorData t{name, std::move(shape), {}};
    t.values.resize(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = v0 + static_cast<float>(i);
    return t;
  };
  Checkpoint c;
  c.config.d_model = 8;
  c.step = 3;
  c.train_config_json = R"({"steps":3})";
  c.params = {tensor("w", {2, 3}, 1), tensor("b", {}, -1), tensor("empty", {0, 3}, 0)};
  // Written through save_checkpoint, so the seed is exactly what the writer produces.
  const std::string path = "/tmp/pwm_fuzz_seed." + std::to_string(::getpid()) + ".ckpt";
  std::vector<std::pair<std::string, std::string>> seeds;
  for (int with_moments = 0; with_moments < 2; ++with_moments) {
    if (with_moments) c.adam_m = c.adam_v = c.params;
    save_checkpoint(path, c);
    std::ifstream in(path, std::ios::binary);
    std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    bytes.resize(bytes.size() - 4);  // the target appends the CRC
    seeds.emplace_back(with_moments ? "adam" : "params", bytes);
  }
  ::unlink(path.c_str());
  return seeds;
}
