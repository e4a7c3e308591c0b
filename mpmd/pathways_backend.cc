#include "mpmd/pathways_backend.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "common/check.h"
#include "common/memory.h"
#include "mpmd/startup.h"
#include "mpmd/trainer.h"
#include "pathways/resource_manager.h"
#include "pathways/runtime.h"

namespace pwm::mpmd {

using train::Granularity;

namespace {

// A Mixture-of-Experts model: one slice (no pipeline, no replicas yet), and a routing that fits
// the capacity and the granularity.
void validate_moe(const train::TrainConfig& cfg) {
  using train::MoeRouting;
  const MoeRouting r = cfg.mpmd.moe_routing;
  if (!cfg.model.moe()) {
    if (r != MoeRouting::kAuto)
      PWM_THROW("--moe-routing {} applies to Mixture-of-Experts models: add --experts E or leave it out", name(r));
    return;
  }
  if (cfg.mpmd.stages > 1 || cfg.mesh.replicas > 1)
    PWM_THROW("pathways_train runs Mixture-of-Experts models on one slice: leave out --stages and --replicas "
              "(spmd_train runs MoE with --replicas)");
  const bool dropless = cfg.model.capacity_factor == 0.0;
  if (r == MoeRouting::kStatic && dropless)
    PWM_THROW("--moe-routing static needs a capacity (--capacity-factor > 0): dropless counts are known only at run "
              "time (use --moe-routing controller or worker)");
  if ((r == MoeRouting::kController || r == MoeRouting::kWorker) && !dropless)
    PWM_THROW("--moe-routing {} routes dropless layers: set --capacity-factor 0 (or use --moe-routing static)", name(r));
  if (r == MoeRouting::kController && cfg.mpmd.granularity == Granularity::kFused)
    PWM_THROW("--moe-routing controller needs --granularity chained or opbyop: a fused step is one kernel, the "
              "controller cannot read the counts inside it");
}

// --expert-island: an MoE model at chained or opbyop (any routing), one experts' device per dense device (the expert-parallel group is the dp slice: spmd_train's
// --dp D --expert-parallel D), on one slice (no pipeline, replicas or --fsdp: validate_moe).
void validate_island(const train::TrainConfig& cfg, int workers) {
  if (!cfg.mpmd.expert_island) return;
  if (!cfg.model.moe()) PWM_THROW("--expert-island places the experts of a Mixture-of-Experts model: add --experts E");
  if (cfg.mpmd.granularity == Granularity::kFused)
    PWM_THROW("--expert-island needs --granularity chained or opbyop: the experts' calls are nodes of their own, which a "
              "fused step (one kernel) cannot send to another island");
  if (cfg.mesh.ep != cfg.mesh.dp)
    PWM_THROW("--expert-island needs --expert-parallel equal to --dp (got {} and {}): one experts' device per dense device",
              cfg.mesh.ep, cfg.mesh.dp);
  if (workers != 2 * cfg.mesh.dp)
    PWM_THROW("--expert-island needs {} workers (--dp {} dense devices and {} experts' devices), but the job has {} "
              "(mpirun -n {})",
              2 * cfg.mesh.dp, cfg.mesh.dp, cfg.mesh.dp, workers, 2 * cfg.mesh.dp + 1);
}

// --islands KxM at start-up (in 64 bits: K and M are each up to 2^20): K x M must be the job's
// workers, and a slice (--dp x --tp devices, of a replica or of a pipeline stage) must fit in one
// island of M, since a slice cannot span islands. The placement of several slices on an island
// is the resource manager's (mpmd/trainer.cc place_slices).
void validate_islands(const train::TrainConfig& cfg, int workers) {
  const std::string& islands = cfg.mpmd.islands;
  const auto [k, m] = pathways::ResourceManager::parse_islands(islands);
  const int64_t devices = static_cast<int64_t>(k) * m;
  if (devices != workers)
    PWM_THROW("--islands {}: {} x {} = {} devices, but the job has {} workers: start it with mpirun -n {} or change "
              "--islands",
              islands, k, m, devices, workers, devices + 1);
  if (cfg.mpmd.expert_island) return;  // (its slices are the dense one and one device per expert group)
  const int64_t slice = static_cast<int64_t>(cfg.mesh.dp) * cfg.mesh.tp;
  if (slice > m)
    PWM_THROW("--islands {}: a slice of --dp {} x --tp {} = {} devices does not fit an island of {} device{} (a slice "
              "cannot span islands): use islands of {} or more devices, or a smaller --dp/--tp",
              islands, cfg.mesh.dp, cfg.mesh.tp, slice, m, m == 1 ? "" : "s", slice);
}

// --spare-workers: what in-job recovery supports (docs/failures.md, "Recovery in the job").
void validate_spares(const train::TrainConfig& cfg, int workers) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.spare_workers < 0) PWM_THROW("--spare-workers must be 0 or more (got {})", p.spare_workers);
  if (p.spare_workers == 0) return;
  if (cfg.model.moe() || p.expert_island || cfg.mesh.fsdp)
    PWM_THROW("--spare-workers runs dense models without --fsdp");
  if (p.spare_workers >= workers)
    PWM_THROW("--spare-workers {} leaves no worker for the slices: the job has {} workers (mpirun -n {})", p.spare_workers,
              workers, workers + 1);
}

// The checks pathways_train adds to TrainConfig::validate: a controller and enough workers, a
// pipeline's layers and devices, what the runtime does not run.
void validate(const train::TrainConfig& cfg, int world) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (world - 1 < 1) PWM_THROW("pathways_train needs a controller and at least one worker: mpirun -n 2 or more");
  validate_spares(cfg, world - 1);
  const int workers = world - 1 - p.spare_workers;  // (the spares hold no slice until one is lost)
  if (p.stages < 1) PWM_THROW("--stages must be at least 1 (got {})", p.stages);
  if (cfg.mesh.fsdp && (p.stages > 1 || cfg.model.moe()))
    PWM_THROW("pathways_train runs --fsdp without --stages and without MoE; use spmd_train for those");
  validate_moe(cfg);
  validate_island(cfg, workers);
  if (!p.islands.empty()) validate_islands(cfg, world - 1);
  if (p.expert_island) return cfg.validate(workers / 2);
  if (cfg.mesh.replicas > 1 && p.granularity == Granularity::kOpByOp)
    PWM_THROW("--replicas {} runs --granularity fused or chained, not opbyop", cfg.mesh.replicas);
  check_stages(cfg, workers, 1);  // (world rank 0 is the controller)
  // dp x tp = the workers, or R x S slices of them
  cfg.validate(p.stages == 1 ? workers : cfg.mesh.replicas * cfg.mesh.dp * cfg.mesh.tp);
}

}  // namespace

train::TrainerSpec pathways_spec() {
  train::TrainerSpec s;
  s.program = "pathways_train";
  s.description =
      "Pathways trainer: a single controller (rank 0) dispatches the training step as programs to the worker ranks.";
  s.flags = train::FlagSet::kPathways;
  s.controller = true;
  s.validate = validate;
  // The runtime's own trace (PWM_PW_TRACE) is written at shutdown, after the training: check its
  // path now, read where the runtime reads it.
  s.more_outputs = [] {
    return std::vector<train::NamedPath>{{"PWM_PW_TRACE", pathways::RuntimeOptions::from_env().trace_path}};
  };
  return s;
}

PathwaysBackend::PathwaysBackend(const train::TrainConfig& cfg, pathways::Client& client, int num_islands)
    : trace_(!cfg.outputs.trace.empty(), 0, 0), client_(client),
      rt_(client, num_islands,
          // The pipeline's schedule is the order of each stage's nodes: run in that order, a stage
          // holds the activations its schedule keeps (1F1B: at most S - s micro-batches), not all M.
          pathways::RunOptions{.sequential = cfg.mpmd.sequential, .in_order = cfg.mpmd.stages > 1}, &trace_) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);  // the workers' rows name their hosts too (programs/device.cc)
  trace_.process_name(fmt::format("controller (rank 0) on {}", host));
}

void PathwaysBackend::report(train::TrainReport& r, const std::vector<int>& slices, const dataflow::Executable*) {
  // Per slice (a pipeline: per stage), the largest of its workers' object-store high-water marks
  // and of their intermediates (activations, gradients in flight) alive at once.
  std::map<int, pathways::WorkerStats> by_rank;
  for (const pathways::WorkerStats& w : client_.stats()) by_rank[w.rank] = w;
  std::vector<double> store, inter;
  for (int sl : slices) {
    uint64_t hw = 0, in = 0;
    for (int d : rt_.devices(sl)) {
      const pathways::WorkerStats& w = by_rank[d + 1];  // device d is world rank d + 1
      hw = std::max(hw, w.high_water_bytes);
      in = std::max(in, w.peak_intermediate_bytes);
    }
    store.push_back(static_cast<double>(hw));
    inter.push_back(static_cast<double>(in));
  }
  r.figures().peak_store_bytes = store;
  r.figures().peak_intermediate_bytes = inter;
  r.figures().controller_peak_rss_bytes = static_cast<double>(peak_resident_bytes());  // this rank's
}

std::vector<std::string> PathwaysBackend::trace_fragments(const std::vector<dataflow::Array>& per_slice, int64_t words) {
  std::vector<std::string> fragments;
  for (const dataflow::Array& a : per_slice) {  // (one slice at a time: 8 MiB a device)
    const auto v = rt_.get<int64_t>(a, "trace");
    for (size_t d = 0; d + static_cast<size_t>(words) <= v.size(); d += static_cast<size_t>(words))
      fragments.emplace_back(reinterpret_cast<const char*>(&v[d + 1]), static_cast<size_t>(v[d]));
  }
  return fragments;
}

std::string run_controller(std::shared_ptr<collectives::Transport> transport, const train::TrainConfig& cfg,
                           bool resume, std::vector<int>* lost, std::function<void(int)> reshape) {
  pathways::RuntimeOptions ro = pathways::RuntimeOptions::from_env();
  ro.islands = cfg.mpmd.islands;
  ro.timeout_s = cfg.exec.coll_timeout;  // liveness: a silent worker ends the job after it
  ro.survive_worker_loss = cfg.mpmd.spare_workers > 0;  // (unless there are spares: Trainer::recover)
  // With replicas, a loss with no spare left goes on with one replica fewer (Trainer::recover).
  // (Not a pipeline's: a replica is S slices there, and its stages' shapes do not follow.)
  ro.survive_without_spare = ro.survive_worker_loss && cfg.mesh.replicas > 1 && cfg.mpmd.stages == 1;
  pathways::Runtime rt(transport, ro);
  const auto& m = cfg.mesh;
  const std::string replicas = m.replicas > 1 ? fmt::format(", replicas={}", m.replicas) : "";
  const std::string layout =
      cfg.mpmd.stages > 1 ? fmt::format("pipeline S={} {} of dp={} x tp={}{}", cfg.mpmd.stages,
                                        train::name(cfg.mpmd.schedule), m.dp, m.tp, replicas)
                          : fmt::format("{} replicas={} dp={} tp={}{}", train::name(cfg.mpmd.granularity),
                                        m.replicas, m.dp, m.tp,
                                        cfg.mpmd.expert_island && cfg.model.moe()
                                            ? fmt::format(", experts on {} devices of their own", m.ep)
                                            : "");
  pathways::Client client = rt.client("trainer");
  std::string stopped;
  {
    PathwaysBackend backend(cfg, client, rt.num_islands());
    Trainer trainer(cfg, backend, resume);  // (the start-up GEMM probe is in it)
    trainer.on_fewer_replicas(std::move(reshape));
    train::print_header(
        "pathways", fmt::format("controller + {} workers ({} islands) | {}", transport->size() - 1, rt.num_islands(), layout),
        cfg, "", trainer.report().peak(), "worker");
    if (resume) fmt::print("[{}] resumed from {} at step {}\n", run_name(cfg, Model::kPathways), cfg.outputs.ckpt, trainer.first_step());
    if (!trainer.run()) stopped = trainer.stop_error();
  }
  rt.shutdown();  // (after the trainer has dropped its arrays: the steps still in flight end first)
  if (lost) *lost = rt.lost_workers();
  return stopped;
}

}  // namespace pwm::mpmd
