#include "tests/pathways_train/conformance.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "collectives/inproc_transport.h"
#include "train/checks.h"
#include "train/flags.h"
#include "train/full_state.h"
#include "spmd/trainer.h"

namespace pwm::pathways::train::testing {

namespace {

// tests/spmd/spmd_cases.py's TINY workload.
const std::vector<std::string> kTiny = {"--d-model", "64", "--layers", "2", "--heads", "4", "--head-dim", "16",
                                        "--d-ff", "128", "--seq-len", "32", "--batch", "8", "--steps", "6",
                                        "--lr", "3e-3", "--peak-gflops", "50", "--eval-batches", "2",
                                        "--log-every", "3", "--coll-timeout", "60"};

pwm::train::MpmdConfig gran(const std::string& g, bool sequential = false) {
  pwm::train::MpmdConfig o;
  o.granularity = pwm::train::parse_granularity(g);
  o.sequential = sequential;
  return o;
}

struct Metrics {
  std::map<int64_t, nlohmann::json> steps;
  std::map<int64_t, double> val;
  std::string hash;
};

Metrics read_metrics(const std::string& path) {
  Metrics m;
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("final")) m.hash = j["weights_hash"].get<std::string>();
    else if (j.contains("val_loss")) m.val[j["step"].get<int64_t>()] = j["val_loss"].get<double>();
    else if (j.contains("loss")) m.steps[j["step"].get<int64_t>()] = j;
  }
  EXPECT_FALSE(m.hash.empty()) << path << " has no final line";
  return m;
}

}  // namespace

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> c;
    const std::vector<std::pair<std::string, std::vector<std::string>>> meshes = {
        {"dp2", {"--dp", "2"}}, {"tp2", {"--tp", "2"}}, {"dp2_mb2", {"--dp", "2", "--microbatches", "2"}}};
    for (const auto& [mesh, flags] : meshes)
      for (const char* g : {"fused", "chained", "opbyop"}) {
        if (std::string(g) == "opbyop" && mesh == "dp2_mb2") continue;  // as pathways_cases.py
        c.push_back({std::string(g) + "_" + mesh, flags, gran(g)});
      }
    c.push_back({"chained_dp2_sequential", {"--dp", "2"}, gran("chained", true)});
    pwm::train::MpmdConfig pipe;
    pipe.stages = 2;
    pipe.schedule = pwm::train::Schedule::k1F1B;
    c.push_back({"pipeline_s2_m4_1f1b", {"--microbatches", "4"}, pipe, false});
    return c;
  }();
  return all;
}

pwm::train::TrainConfig workload(const Case& c, const std::string& metrics) {
  std::vector<std::string> args = {"pathways_conformance"};
  args.insert(args.end(), kTiny.begin(), kTiny.end());
  args.insert(args.end(), c.flags.begin(), c.flags.end());
  args.insert(args.end(), {"--metrics", metrics});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  pwm::train::TrainConfig cfg;
  int exit_code = 0;
  PWM_CHECK(pwm::train::parse_train_config(static_cast<int>(argv.size()), argv.data(), "conformance", "", cfg, exit_code,
                                      false),
            "case {}: flags not parsed", c.name);
  cfg.mpmd = c.po;
  cfg.validate(c.po.stages > 1 ? 1 : kWorkers);
  return cfg;
}

CaseKernels register_case(const Case& c, const std::string& metrics, const std::string& prefix) {
  CaseKernels k;
  k.cfg = workload(c, metrics);
  k.devices = std::make_shared<DeviceSet>(k.cfg, PipelineShape{c.po.stages});
  k.names = KernelNames{prefix};
  k.data = pwm::train::open_training_data(k.cfg);
  register_train_kernels(k.names, k.devices);
  return k;
}

void train_case(const CaseKernels& k, const Case& c, Client& client, int num_islands) {
  Trainer(k.cfg, client, num_islands, 50.0, false, k.names).run();
}

void expect_matches_spmd(const Case& c, const std::string& pathways_metrics, const std::string& dir) {
  const std::string ref_path = dir + "/spmd.jsonl";
  pwm::train::TrainConfig cfg = workload(c, ref_path);
  auto data = pwm::train::open_training_data(cfg);
  collectives::run_inproc(cfg.mesh.dp * cfg.mesh.tp, [&](int, std::shared_ptr<collectives::Transport> t) {
    spmd::Trainer trainer(cfg, t, *data, 50.0, std::nullopt);
    trainer.run();
  });
  const Metrics ref = read_metrics(ref_path), got = read_metrics(pathways_metrics);
  ASSERT_EQ(ref.steps.size(), got.steps.size()) << c.name;
  ASSERT_EQ(ref.steps.size(), static_cast<size_t>(cfg.workload.steps)) << c.name;
  for (const auto& [s, r] : ref.steps) {
    ASSERT_TRUE(got.steps.count(s)) << c.name << ": no step " << s;
    const auto& g = got.steps.at(s);
    if (c.bitwise) {
      for (const char* k : {"loss", "lr", "grad_norm"})
        EXPECT_EQ(g[k].get<double>(), r[k].get<double>()) << c.name << ": step " << s << " " << k;
    } else {
      const double a = r["loss"].get<double>(), b = g["loss"].get<double>();
      EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(a)) << c.name << ": step " << s << " loss " << b << " vs " << a;
    }
  }
  ASSERT_EQ(ref.val.size(), got.val.size()) << c.name;
  for (const auto& [s, v] : ref.val) {
    if (c.bitwise) {
      EXPECT_EQ(got.val.at(s), v) << c.name << ": validation loss at " << s;
    } else {
      EXPECT_LE(std::abs(got.val.at(s) - v), 1e-5 * std::abs(v)) << c.name << ": validation loss at " << s;
    }
  }
  if (c.bitwise) {
    EXPECT_EQ(got.hash, ref.hash) << c.name << ": final weights differ from spmd_train's";
  }
}

std::string temp_dir(const std::string& tag) {
  const std::string d = ::testing::TempDir() + "pw_conf_" + std::to_string(::getpid()) + "_" + tag;
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace pwm::pathways::train::testing
