#include "tests/mpmd/conformance.h"

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
#include "mpmd/pathways_backend.h"
#include "mpmd/static_backend.h"
#include "mpmd/trainer.h"
#include "spmd/trainer.h"

namespace pwm::mpmd::testing {

using programs::PipelineShape;
using programs::register_train_kernels;

namespace {

// tests/harness/workloads.py's TINY workload.
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

// An MoE step's routing figures are spmd_train's (the same choices on the same devices), and the
// controller's round trips, as the runtime counted them, are one per MoE layer and micro-batch
// with --moe-routing controller, none else.
void expect_same_routing(const Case& c, const pwm::train::TrainConfig& cfg, int64_t s, const nlohmann::json& r,
                         const nlohmann::json& g) {
  ASSERT_EQ(r.contains("moe"), g.contains("moe")) << c.name << ": step " << s;
  if (!r.contains("moe")) return;
  for (const char* k : {"dropped_share", "padding_share", "max_mean_tokens", "device_max_mean", "lb_loss", "z_loss"})
    EXPECT_EQ(g["moe"][k].get<double>(), r["moe"][k].get<double>()) << c.name << ": step " << s << " moe " << k;
  const bool controller = c.po.routing(cfg.model) == pwm::train::MoeRouting::kController;
  // (--expert-island: one round trip per experts' device.)
  const double want = controller ? static_cast<double>(cfg.workload.microbatches * cfg.model.moe_layers() *
                                                       (c.po.expert_island ? cfg.mesh.ep : 1))
                                 : 0.0;
  ASSERT_TRUE(g["moe"].contains("round_trips")) << c.name;
  EXPECT_EQ(g["moe"]["round_trips"].get<double>(), want) << c.name << ": step " << s;
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
    // Sharded data parallelism (--fsdp): the step on the dp shards, spmd_train's Fsdp; and
    // inside each of two islands, the shards exchanged between them (4 workers: in process only).
    for (const char* g : {"fused", "chained", "opbyop"})
      c.push_back({std::string(g) + "_dp2_fsdp", {"--dp", "2", "--fsdp"}, gran(g)});
    for (const char* g : {"fused", "chained"}) {
      pwm::train::MpmdConfig two_islands = gran(g);
      two_islands.islands = "2x2";
      c.push_back({std::string(g) + "_r2_dp2_fsdp", {"--replicas", "2", "--dp", "2", "--fsdp"}, two_islands, true, 4});
    }
    // Three data-parallel devices: from three summands on the order of a sum shows in the bits,
    // and chained's per-layer pieces must be summed as spmd_train's buckets (dp_allreduce,
    // docs/pathways_train.md, "The dp sums"); with small buckets every piece spans several.
    for (const char* g : {"fused", "chained", "opbyop"})
      c.push_back({std::string(g) + "_dp3", {"--dp", "3", "--batch", "12"}, gran(g), true, 3});
    c.push_back(
        {"chained_dp3_buckets4k", {"--dp", "3", "--batch", "12", "--bucket-bytes", "4096"}, gran("chained"), true, 3});
    // Mixture of Experts, the experts split over the two devices (AllToAll inside the block
    // kernels): the three routings (docs/pathways_train_moe.md), each against spmd_train's bits.
    const std::vector<std::string> moe = {"--dp", "2", "--expert-parallel", "2", "--experts", "4", "--top-k", "2"};
    const auto with = [&moe](std::vector<std::string> more) {
      std::vector<std::string> f = moe;
      f.insert(f.end(), more.begin(), more.end());
      return f;
    };
    const auto routed = [](const char* g, pwm::train::MoeRouting r) {
      pwm::train::MpmdConfig o = gran(g);
      o.moe_routing = r;
      return o;
    };
    using pwm::train::MoeRouting;
    for (const char* g : {"fused", "chained"})
      c.push_back({std::string("moe_static_") + g, with({"--capacity-factor", "1.25"}), routed(g, MoeRouting::kStatic)});
    for (const char* g : {"fused", "chained"})
      c.push_back({std::string("moe_worker_") + g + "_mb2", with({"--capacity-factor", "0", "--microbatches", "2"}),
                   routed(g, MoeRouting::kWorker)});
    for (const char* g : {"chained", "opbyop"})
      c.push_back({std::string("moe_controller_") + g + "_mb2",
                   with({"--capacity-factor", "0", "--microbatches", "2", "--moe-every", "1"}),
                   routed(g, MoeRouting::kController)});
    // --expert-island: the experts on devices of their own, the rows crossing as program edges
    // (programs/island_kernels.cc): against spmd_train's --dp D --expert-parallel D, bitwise. Two islands of
    // two in process; under mpirun (one dense device and one experts' device) the one island.
    const auto island = [&](const char* g, pwm::train::MoeRouting r, const char* islands) {
      pwm::train::MpmdConfig o = routed(g, r);
      o.expert_island = true;
      o.islands = islands;
      return o;
    };
    c.push_back({"moe_island_static_chained", with({"--capacity-factor", "1.25"}),
                 island("chained", MoeRouting::kStatic, "2x2"), true, 4});
    c.push_back({"moe_island_worker_opbyop_mb2", with({"--capacity-factor", "0", "--microbatches", "2"}),
                 island("opbyop", MoeRouting::kWorker, "2x2"), true, 4});
    c.push_back({"moe_island_controller_chained_mb2",
                 with({"--capacity-factor", "0", "--microbatches", "2", "--moe-every", "1"}),
                 island("chained", MoeRouting::kController, "2x2"), true, 4});
    c.push_back({"moe_island_dp1_worker_chained_mb2",
                 {"--experts", "4", "--top-k", "2", "--capacity-factor", "0", "--microbatches", "2", "--moe-every", "1"},
                 island("chained", MoeRouting::kWorker, ""), true, 2});
    pwm::train::MpmdConfig pipe;
    pipe.stages = 2;
    pipe.schedule = pwm::train::Schedule::k1F1B;
    c.push_back({"pipeline_s2_m4_1f1b", {"--microbatches", "4"}, pipe, false});
    return c;
  }();
  return all;
}

std::vector<Case> static_cases() {
  std::vector<Case> out;
  for (const Case& c : cases()) {
    const auto& p = c.po;
    if (p.granularity == pwm::train::Granularity::kOpByOp || p.sequential || p.expert_island ||
        p.moe_routing == pwm::train::MoeRouting::kController)
      continue;
    out.push_back(c);
  }
  return out;
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
  cfg.validate(c.po.stages > 1 ? 1 : c.po.expert_island ? c.workers / 2 : c.workers);
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

void train_case(const CaseKernels& k, const Case&, pathways::Client& client, int num_islands) {
  PathwaysBackend backend(k.cfg, client, num_islands);
  Trainer(k.cfg, backend, false, k.names).run();
}

void train_static_case(const CaseKernels& k, std::shared_ptr<collectives::Transport> t) {
  StaticBackend backend(k.cfg, std::move(t));
  Trainer(k.cfg, backend, false, k.names).run();
}

void expect_matches_spmd(const Case& c, const std::string& pathways_metrics, const std::string& dir) {
  const std::string ref_path = dir + "/spmd.jsonl";
  pwm::train::TrainConfig cfg = workload(c, ref_path);
  auto data = pwm::train::open_training_data(cfg);
  collectives::run_inproc(cfg.mesh_ranks(), [&](int, std::shared_ptr<collectives::Transport> t) {
    spmd::Trainer trainer(cfg, t, *data, pwm::train::Peak::given(50.0), nullptr, std::nullopt);
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
      expect_same_routing(c, cfg, s, r, g);
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

}  // namespace pwm::mpmd::testing
