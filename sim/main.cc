// pwm_sim: predicts step times and dispatch throughput from a machine profile and a cluster
// (docs/simulator.md).
//
//   pwm_sim --what step --profile P [--cluster C] [--granularity spmd|fused|chained|opbyop] TRAIN FLAGS
//   pwm_sim --what pipeline --profile P [--cluster C] --stages S --schedule gpipe|1f1b TRAIN FLAGS
//           (both: --mpmd pathways|static, whether pathways_train or mpmd_train runs the program)
//   pwm_sim --what dispatch --profile P [--cluster C] --workers W --compute-us 0,50,... [--chain K]
//           (a "static" column, mpmd_train's executor, when the profile has the static costs)
//   pwm_sim --what stages|clients ... (Fig. 7, Fig. 8)
//   pwm_sim --what fig6 --profile P --cluster C --hosts-list 2,4,...,512 (C is one host's description)
//   pwm_sim --what kernels --trace T.json --metrics M.jsonl TRAIN FLAGS   (calibration: the kernels section)
//   pwm_sim --what moe --profile P [--cluster C] [--moe-imbalance X] TRAIN FLAGS (--experts E ...): one MoE
//           step under SPMD (capacity, dropless) and Pathways chained (static, controller, worker routing)
// TRAIN FLAGS are the trainers' own (train/config.h), --config FILE included. Output: one
// JSON object per line on stdout.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "common/check.h"
#include "common/parse.h"
#include "common/paths.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "train/config.h"
#include "train/flags.h"
#include "sim/dispatch.h"
#include "sim/moe.h"
#include "sim/step.h"

using namespace pwm;
using nlohmann::json;

namespace {

// A comma-separated list of numbers in [lo, hi] (whole numbers when `whole`), sorted.
std::vector<double> parse_list(const std::string& s, const char* flag, double lo, double hi, bool whole = false) {
  std::vector<double> v;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    const std::string what = fmt::format("{} {} (comma-separated {} in [{}, {}])", flag, s,
                                         whole ? "whole numbers" : "numbers", lo, hi);
    const std::string item = s.substr(p, q - p);
    const double x = whole ? static_cast<double>(parse_whole(what, item)) : parse_real(what, item);
    if (!(x >= lo && x <= hi)) PWM_THROW("{}: {} is outside [{}, {}]", what, item, lo, hi);
    v.push_back(x);
    p = q + 1;
  }
  std::sort(v.begin(), v.end());
  return v;
}

// A JSON file given by `flag` (checked before it is opened); syntax errors in the project's words.
json read_json_file(const std::string& path, const char* flag) {
  if (path.empty()) PWM_THROW("{} is required with --what kernels: give the trainer's file", flag);
  check_input_file(flag, path, uintmax_t{1} << 30);
  std::ifstream in(path);
  if (!in) PWM_THROW("{} {}: cannot open it; check the path and its permissions", flag, path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) PWM_THROW("{} {} is not valid JSON: give the file spmd_train --trace wrote", flag, path);
  return j;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The kernels section of a profile from a trainer's --trace and --metrics at dp = 1.
json calibrate_kernels(const train::TrainConfig& cfg, const std::string& trace, const std::string& metrics) {
  const json t = read_json_file(trace, "--sim-trace");
  if (t.is_object() && !(t.contains("traceEvents") && t["traceEvents"].is_array()))
    PWM_THROW("--sim-trace {} has no traceEvents array: record it with spmd_train --trace", trace);
  if (!t.is_object() && !t.is_array())
    PWM_THROW("--sim-trace {} is not a trace (a JSON object or array of events): record it with spmd_train --trace", trace);
  const json& ev = t.is_object() ? t["traceEvents"] : t;
  std::vector<double> fwd, bwd, opt;
  for (const auto& e : ev) {
    if (!e.is_object() || !e.contains("ph") || e["ph"] != "X" || !e.contains("name") || !e["name"].is_string()) continue;
    if (!e.contains("dur") || !e["dur"].is_number())
      PWM_THROW("--sim-trace {}: a complete event without a numeric dur: record it with spmd_train --trace", trace);
    const std::string n = e["name"].get<std::string>();
    const double d = e["dur"].get<double>();
    if (n == "forward") fwd.push_back(d);
    else if (n == "backward") bwd.push_back(d);
    else if (n == "optimizer") opt.push_back(d);
  }
  if (fwd.empty() || bwd.empty() || opt.empty())
    PWM_THROW("--sim-trace {} has no forward/backward/optimizer spans: record it with spmd_train --trace", trace);
  if (metrics.empty()) PWM_THROW("--sim-metrics is required with --what kernels: give the trainer's --metrics file");
  check_input_file("--sim-metrics", metrics, uintmax_t{1} << 30);
  std::ifstream min(metrics);
  if (!min) PWM_THROW("--sim-metrics {}: cannot open it; check the path and its permissions", metrics);
  double step_ms = 0;
  int64_t line_no = 0;
  for (std::string line; std::getline(min, line);) {
    ++line_no;
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      PWM_THROW("--sim-metrics {}: line {} is not a JSON object: give the file spmd_train --metrics wrote", metrics, line_no);
    if (j.contains("final") && j["final"] == true) {
      if (!j.contains("step_ms_p50") || !j["step_ms_p50"].is_number())
        PWM_THROW("--sim-metrics {}: the final line (line {}) has no numeric step_ms_p50", metrics, line_no);
      step_ms = j["step_ms_p50"].get<double>();
    }
  }
  if (!(step_ms > 0)) PWM_THROW("--sim-metrics {} has no final line with step_ms_p50 > 0", metrics);
  const model::ParamLayout layout(cfg.model, 0, 1);
  const model::StepPlan plan(layout, cfg.workload.microbatches);
  const sim::UnitFlops f = sim::micro_flops(cfg.model, plan, cfg.micro_batch());
  const double mf = median(fwd), mb = median(bwd), mo = median(opt);
  const double M = static_cast<double>(cfg.workload.microbatches);
  return {{"fwd_us_per_gflop", mf / (f.fwd * 1e-9)},
          {"bwd_us_per_gflop", mb / (f.bwd * 1e-9)},
          {"opt_us_per_param", mo / static_cast<double>(layout.total())},
          {"step_overhead_us", std::max(0.0, step_ms * 1e3 - M * (mf + mb) - mo)},
          {"from", {{"trace", trace}, {"forward_us", mf}, {"backward_us", mb}, {"optimizer_us", mo}, {"step_ms_p50", step_ms}}}};
}

// --what, parsed once.
enum class What { kStep, kPipeline, kDispatch, kStages, kClients, kFig6, kKernels, kMoe };
What parse_what(const std::string& w) {
  constexpr std::pair<What, const char*> kAll[] = {{What::kStep, "step"},       {What::kPipeline, "pipeline"},
                                                   {What::kDispatch, "dispatch"}, {What::kStages, "stages"},
                                                   {What::kClients, "clients"},   {What::kFig6, "fig6"},
                                                   {What::kKernels, "kernels"},   {What::kMoe, "moe"}};
  for (const auto& [v, t] : kAll)
    if (w == t) return v;
  PWM_THROW("unknown --what '{}' (step, pipeline, dispatch, stages, clients, fig6, kernels, moe)", w);
}

// The simulator's own flags (the trainers' come from train/flags.h).
struct SimFlags {
  std::string what = "step", profile_path, cluster_path, granularity = "spmd", schedule = "gpipe";
  std::string compute_s = "0,10,20,50,100,200,500,1000,2000,5000", hosts_s = "2,4,8,16,32,64,128,256,512";
  std::string trace, metrics, clients_s = "1,2,4,8,16", moe_routing = "auto", mpmd = "pathways";
  int stages = 0, workers = 2, chain = 128;
  bool controller_alone = false, host_executors = false;
  double stage_us = 100;
  double moe_imbalance = 1.0;

  void add(CLI::App& app) {
    const char* S = "Simulator";
    app.add_option("--what", what, "step | pipeline | dispatch | stages | clients | fig6 | kernels | moe")->group(S);
    app.add_option("--profile", profile_path, "machine profile (mpi_scripts/sim_calibrate.sh)")->group(S);
    app.add_option("--cluster", cluster_path, "cluster description (JSON; default: one host of the profile's machine)")->group(S);
    app.add_option("--granularity", granularity, "step: spmd | fused | chained | opbyop")->group(S);
    app.add_option("--stages", stages, "pipeline stages (Fig. 7: pipeline length)")->group(S);
    app.add_option("--schedule", schedule, "pipeline: gpipe | 1f1b")->group(S);
    app.add_option("--mpmd", mpmd,
                   "step (fused, chained) and pipeline: pathways (pathways_train, a controller) | static (mpmd_train, none)")->group(S);
    app.add_option("--workers", workers, "dispatch: workers (devices)")->group(S);
    app.add_option("--chain", chain, "dispatch: computations per chain")->group(S);
    app.add_option("--compute-us", compute_s, "dispatch: comma-separated compute times T (us)")->group(S);
    app.add_option("--stage-us", stage_us, "stages: compute per stage (us)")->group(S);
    app.add_option("--clients", clients_s, "clients: comma-separated numbers of clients")->group(S);
    app.add_option("--hosts-list", hosts_s, "fig6: comma-separated host counts")->group(S);
    app.add_flag("--controller-alone", controller_alone, "dispatch: the controller on a host of its own")->group(S);
    app.add_flag("--host-executors", host_executors, "dispatch: one message per host, not per device")->group(S);
    app.add_option("--sim-trace", trace, "kernels: the trainer's --trace file")->group(S);
    app.add_option("--sim-metrics", metrics, "kernels: the trainer's --metrics file")->group(S);
    app.add_option("--moe-routing", moe_routing, "step, MoE under Pathways: auto | static | controller | worker (as pathways_train)")->group(S);
    app.add_option("--moe-imbalance", moe_imbalance,
                   "MoE dropless: the busiest expert-parallel device's rows over the mean (an assumption; 1 = balanced)")->group(S);
  }
};

// The most devices a dispatch simulation takes (its time grows about quadratically: 4096
// workers take some 10 s) and the most stages of a program (its transfers' tags).
constexpr int kMaxDevices = 8192, kMaxStages = 4096;

// Every number of the simulator's flags by name, before a file is read. The caps keep a typo
// (--workers 1000000000) from running for hours or overflowing a count.
void check_flags(const SimFlags& f, What w) {
  auto in = [](const char* flag, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) PWM_THROW("{} must be in [{}, {}] (got {})", flag, lo, hi, v);
  };
  in("--workers", f.workers, 1, kMaxDevices);
  in("--chain", f.chain, 1, 1 << 20);
  in("--stage-us", f.stage_us, 0, 1e9);
  in("--stages", f.stages, w == What::kPipeline ? 1 : 0, kMaxStages);
  in("--moe-imbalance", f.moe_imbalance, 1, kMaxDevices);
  switch (w) {
    case What::kDispatch: parse_list(f.compute_s, "--compute-us", 0, 1e9); break;
    case What::kClients:
      parse_list(f.compute_s, "--compute-us", 0, 1e9);
      parse_list(f.clients_s, "--clients", 1, 4096, true);
      break;
    case What::kFig6: parse_list(f.hosts_s, "--hosts-list", 1, kMaxDevices, true); break;
    case What::kStages:  // the pipeline lengths come in --compute-us here (default 1,2,4,8,16)
      if (f.compute_s != "0,10,20,50,100,200,500,1000,2000,5000") parse_list(f.compute_s, "--compute-us", 1, kMaxStages, true);
      break;
    default: break;
  }
  if (w != What::kKernels && f.profile_path.empty())
    PWM_THROW("--profile is required (make one with mpi_scripts/sim_calibrate.sh)");
}

void out(const json& j) { fmt::print("{}\n", j.dump()); }

// One MoE step's row: the step's figures and the MoE layer's (per MoE layer and micro-batch).
json moe_row(const sim::MoeStep& r, const train::TrainConfig& cfg) {
  const sim::StepPrediction& s = r.step;
  return {{"dp", cfg.mesh.dp}, {"expert_parallel", cfg.mesh.ep}, {"experts", cfg.model.experts},
          {"capacity_factor", cfg.model.capacity_factor}, {"step_ms", s.step_us * 1e-3}, {"compute_ms", s.compute_us * 1e-3},
          {"exposed_comm_ms", s.exposed_comm_us * 1e-3}, {"alltoall_ms", r.alltoall_total_us * 1e-3},
          {"round_trips", r.round_trips}, {"round_trip_ms", r.round_trip_total_us * 1e-3},
          {"tokens_per_s", s.tokens_per_s}, {"collectives", s.collectives}, {"nodes", s.nodes},
          {"layer_alltoall_fwd_us", r.layer.alltoall_fwd_us}, {"layer_alltoall_bwd_us", r.layer.alltoall_bwd_us},
          {"layer_counts_us", r.layer.counts_us}, {"layer_moe_counts_us", r.layer.moe_counts_us},
          {"layer_round_trip_us", r.layer.round_trip_us}};
}

// --what moe: the step under SPMD with a capacity (the model's, else Config's default) and
// dropless, and under Pathways chained with each routing; then the controller's round trip per
// MoE layer and micro-batch against SPMD's AllToAlls, and the two ratios.
void moe_compare_rows(const sim::Cluster& c, const sim::Profile& p, const train::TrainConfig& cfg, const SimFlags& f) {
  using train::MoeRouting;
  const double cap = cfg.model.capacity_factor > 0 ? cfg.model.capacity_factor : model::Config{}.capacity_factor;
  sim::CollectiveTimes times;
  auto run = [&](const char* name, double factor, sim::ExecMode mode, MoeRouting routing) {
    const sim::MoeOptions o{f.moe_imbalance, &times};
    train::TrainConfig v = cfg;
    v.model.capacity_factor = factor;
    v.mpmd.moe_routing = routing;
    const sim::MoeStep r = sim::simulate_moe_step(c, p, v, mode, o);
    json row = moe_row(r, v);
    row["what"] = "moe";
    row["variant"] = name;
    row["cluster"] = c.name;
    row["imbalance"] = factor > 0 ? 1.0 : f.moe_imbalance;
    out(row);
    return r;
  };
  const sim::MoeStep sc = run("spmd_capacity", cap, sim::ExecMode::kSpmd, MoeRouting::kAuto);
  const sim::MoeStep sd = run("spmd_dropless", 0, sim::ExecMode::kSpmd, MoeRouting::kAuto);
  const sim::MoeStep ps = run("pathways_static", cap, sim::ExecMode::kChained, MoeRouting::kStatic);
  const sim::MoeStep pc = run("pathways_controller", 0, sim::ExecMode::kChained, MoeRouting::kController);
  const sim::MoeStep pw = run("pathways_worker", 0, sim::ExecMode::kChained, MoeRouting::kWorker);
  out({{"what", "moe_layer"}, {"round_trip_us", pc.layer.round_trip_us},
       {"moe_counts_us", pc.layer.moe_counts_us}, {"spmd_dropless_alltoall_fwd_us", sd.layer.alltoall_fwd_us},
       {"spmd_dropless_alltoall_bwd_us", sd.layer.alltoall_bwd_us}, {"spmd_counts_us", sd.layer.counts_us},
       {"round_trip_over_spmd_alltoall", sd.layer.alltoall_fwd_us + sd.layer.alltoall_bwd_us + sd.layer.counts_us > 0
                                             ? pc.layer.round_trip_us / (sd.layer.alltoall_fwd_us + sd.layer.alltoall_bwd_us + sd.layer.counts_us)
                                             : 0.0},
       {"controller_over_spmd_dropless", pc.step.step_us / sd.step.step_us},
       {"worker_over_spmd_dropless", pw.step.step_us / sd.step.step_us},
       {"static_over_spmd_capacity", ps.step.step_us / sc.step.step_us}});
}

void step_rows(const sim::Cluster& c, const sim::Profile& p, const train::TrainConfig& cfg, const SimFlags& f, What w) {
  if (cfg.model.moe()) {
    json row = moe_row(sim::simulate_moe_step(c, p, cfg, sim::parse_exec_mode(f.granularity), sim::MoeOptions{f.moe_imbalance}),
                       cfg);
    row["what"] = f.what;
    row["granularity"] = f.granularity;
    row["moe_routing"] = f.granularity == "spmd" ? "spmd" : train::name(cfg.mpmd.routing(cfg.model));
    row["cluster"] = c.name;
    out(row);
    return;
  }
  const sim::MpmdModel mm = sim::parse_mpmd_model(f.mpmd);
  const sim::StepPrediction r = w == What::kStep ? sim::simulate_step(c, p, cfg, sim::parse_exec_mode(f.granularity), mm)
                                                 : sim::simulate_pipeline(c, p, cfg, f.stages, train::parse_schedule(f.schedule), mm);
  out({{"what", f.what}, {"granularity", w == What::kStep ? f.granularity : f.schedule}, {"mpmd", f.mpmd}, {"dp", cfg.mesh.dp}, {"stages", f.stages},
       {"cluster", c.name}, {"step_ms", r.step_us * 1e-3}, {"compute_ms", r.compute_us * 1e-3},
       {"exposed_comm_ms", r.exposed_comm_us * 1e-3}, {"bubble", r.bubble}, {"tokens_per_s", r.tokens_per_s},
       {"collectives", r.collectives}, {"nodes", r.nodes}, {"params", model::ParamLayout(cfg.model, 0, 1).total()}});
}

// Fig. 6: C describes the cluster's hosts (devices per host, links); every host count gets every
// device as a worker (one island over the cluster, as the paper's Fig. 6).
void fig6_rows(const sim::Cluster& c, const sim::Profile& p, const sim::DispatchOptions& o, const SimFlags& f) {
  using sim::ExecMode;
  std::vector<double> ts;
  for (double t = 1; t <= 2e5; t *= 1.1) ts.push_back(t);
  for (double h : parse_list(f.hosts_s, "--hosts-list", 1, kMaxDevices, true))
    if (h * c.devices_per_host > kMaxDevices)
      PWM_THROW("--hosts-list {}: {} hosts x {} devices per host is more than the {} devices the simulator takes",
                f.hosts_s, h, c.devices_per_host, kMaxDevices);
  for (double h : parse_list(f.hosts_s, "--hosts-list", 1, kMaxDevices, true)) {
    sim::Cluster ch = c;
    ch.hosts = static_cast<int>(h);
    sim::DispatchOptions oh = o;
    oh.workers = ch.devices();
    out({{"what", "fig6"}, {"hosts", ch.hosts}, {"devices", ch.devices()},
         {"opbyop_break_even_us", sim::break_even(ch, p, oh, ExecMode::kOpByOp, ts)},
         {"chained_break_even_us", sim::break_even(ch, p, oh, ExecMode::kChained, ts)},
         {"fused_break_even_us", sim::break_even(ch, p, oh, ExecMode::kFused, ts)}});
  }
}

void chain_rows(const sim::Cluster& c, const sim::Profile& p, const sim::DispatchOptions& o, const SimFlags& f, What w) {
  using sim::ExecMode;
  if (w == What::kDispatch) {
    const sim::ChainInputs pre = sim::prepare_chain(c, p, o);
    for (double t : parse_list(f.compute_s, "--compute-us", 0, 1e9)) {
      json row = {{"what", "dispatch"}, {"workers", f.workers}, {"compute_us", t}};
      for (ExecMode m : {ExecMode::kSpmd, ExecMode::kOpByOp, ExecMode::kChained, ExecMode::kFused})
        row[sim::name(m)] = sim::simulate_chain(c, p, o, m, t, &pre);
      // dispatch_bench's static row, when the profile measured the static model.
      if (p.mpmd_static) row["static"] = sim::simulate_static_chain(c, p, o, t, &pre);
      out(row);
    }
  } else if (w == What::kStages) {
    const std::string& ks = f.compute_s == "0,10,20,50,100,200,500,1000,2000,5000" ? "1,2,4,8,16" : f.compute_s;
    for (double k : parse_list(ks, "--compute-us", 1, kMaxStages, true)) {
      const int s = static_cast<int>(k);
      out({{"what", "stages"}, {"stages", s}, {"parallel_s", sim::simulate_stages(c, p, o, s, f.stage_us, false)},
           {"sequential_s", sim::simulate_stages(c, p, o, s, f.stage_us, true)}});
    }
  } else {  // clients
    for (double t : parse_list(f.compute_s, "--compute-us", 0, 1e9))
      for (double n : parse_list(f.clients_s, "--clients", 1, 4096, true))
        out({{"what", "clients"}, {"compute_us", t}, {"clients", static_cast<int>(n)},
             {"per_s", sim::simulate_clients(c, p, o, static_cast<int>(n), t)},
             {"spmd_per_s", sim::simulate_chain(c, p, o, ExecMode::kSpmd, t)}});
  }
}

int body(int argc, char** argv) {
  SimFlags f;
  train::TrainConfig cfg;
  int exit_code = 0;
  const bool go = train::parse_train_config(argc, argv, "pwm_sim", "Simulates both execution models from a measured machine profile",
                                            cfg, exit_code, true, [&](CLI::App& app) { f.add(app); });
  if (!go) return exit_code;
  const What w = parse_what(f.what);
  // Mixture of Experts: one step (sim/moe.h), alone or compared; not the pipeline, not the
  // calibration (whose kernels are the dense block's).
  if (cfg.model.moe() && w != What::kStep && w != What::kMoe)
    PWM_THROW("pwm_sim simulates Mixture-of-Experts models (--experts {}) with --what step or moe only (got --what {})",
              cfg.model.experts, f.what);
  if (w == What::kMoe && !cfg.model.moe()) PWM_THROW("--what moe needs a Mixture-of-Experts model: add --experts E");
  // --mpmd static picks the runner of a step or a pipeline (--what dispatch prints the static
  // chain beside the others whenever the profile has its costs).
  if (sim::parse_mpmd_model(f.mpmd) == sim::MpmdModel::kStatic && (cfg.model.moe() || (w != What::kStep && w != What::kPipeline)))
    PWM_THROW("--mpmd static is simulated with --what step or pipeline of a dense model (got --what {}{})", f.what,
              cfg.model.moe() ? " and --experts" : "");
  cfg.mpmd.moe_routing = train::parse_moe_routing(f.moe_routing);
  if (!cfg.model.moe() && cfg.mpmd.moe_routing != train::MoeRouting::kAuto)
    PWM_THROW("--moe-routing {} applies to Mixture-of-Experts models: add --experts E or leave it out", f.moe_routing);
  check_flags(f, w);
  // The trainers' own checks of their flags, the simulated job being the mesh (--dp 0 would
  // divide by zero, a batch not divisible by the mesh would simulate a step no trainer runs).
  const train::MeshConfig& m = cfg.mesh;
  if (m.replicas < 1 || m.dp < 1 || m.tp < 1)
    PWM_THROW("--replicas, --dp and --tp must be at least 1 (got replicas={} dp={} tp={})", m.replicas, m.dp, m.tp);
  const double ranks = static_cast<double>(m.replicas) * m.dp * m.tp;  // no int overflow
  if (ranks > kMaxDevices)
    PWM_THROW("mesh --replicas {} x --dp {} x --tp {} = {} ranks is more than the {} devices the simulator takes",
              m.replicas, m.dp, m.tp, ranks, kMaxDevices);
  cfg.validate(static_cast<int>(cfg.mesh_ranks()));
  if (w == What::kKernels) {
    fmt::print("{}\n", calibrate_kernels(cfg, f.trace, f.metrics).dump());
    return 0;
  }
  const sim::Profile p = sim::Profile::load(f.profile_path);
  const int need = w == What::kStep || w == What::kMoe ? static_cast<int>(cfg.mesh.dp) : w == What::kPipeline ? f.stages : f.workers;
  const sim::Cluster c = f.cluster_path.empty() ? sim::Cluster::local(p, std::max(need, 1)) : sim::Cluster::load(f.cluster_path, p);
  sim::DispatchOptions o;
  o.workers = f.workers;
  o.chain = f.chain;
  o.controller_alone = f.controller_alone;
  o.host_executors = f.host_executors;
  switch (w) {
    case What::kStep:
    case What::kPipeline: step_rows(c, p, cfg, f, w); break;
    case What::kFig6: fig6_rows(c, p, o, f); break;
    case What::kMoe: moe_compare_rows(c, p, cfg, f); break;
    default: chain_rows(c, p, o, f, w); break;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pwm::run_tool_main("pwm_sim", argc, argv, body); }
