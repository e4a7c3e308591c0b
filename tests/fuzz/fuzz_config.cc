// Fuzz target: the --config FILE reader (train::parse_train_config_text, what
// load_train_config_file runs on the file's text), then what a trainer does next with the
// result: validate it and print it as JSON.
#include "common/check.h"
#include "train/config.h"
#include "train/flags.h"
#include "tests/fuzz/fuzz.h"

using namespace pwm::model;
using namespace pwm::train;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  TrainConfig cfg;
  try {
    parse_train_config_text({reinterpret_cast<const char*>(data), size}, "fuzz.json", cfg);
    cfg.optim.total_steps = cfg.workload.steps;  // as parse_train_config does
    (void)cfg.to_json();
    (void)cfg.workload_json();
    cfg.validate(2);  // two compute ranks, as most tests run
  } catch (const pwm::Error&) {
    // rejected with one clear error: what the trainers promise
  }
  return 0;
}

std::vector<std::pair<std::string, std::string>> pwm_fuzz_seeds() {
  return {{"small", R"({"d-model": 64, "layers": 2, "heads": 2, "head-dim": 32, "d-ff": 128, "seq-len": 32,
                        "batch": 4, "steps": 3, "dp": 2, "lr": 0.001, "overlap": false, "data": "x.txt"})"},
          {"outputs", R"({"metrics": "m.jsonl", "trace": "t.json", "ckpt": "c.ckpt", "ckpt-every": 2,
                          "resume": true, "coll-timeout": 30.5, "bucket-bytes": 4096})"},
          {"empty", "{}"}};
}
