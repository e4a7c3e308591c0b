// pathways_train: the same Transformer and workload as spmd_train, run as Pathways programs by a
// single controller (world rank 0) over N worker ranks:
//   mpirun -n 3 pathways_train --dp 2 --granularity fused --steps 50 --metrics m.jsonl
//   mpirun -n 3 pathways_train --stages 2 --islands 2x1 --microbatches 8 --schedule 1f1b
//   mpirun -n 5 pathways_train --replicas 2 --stages 2 --islands 2x2 --microbatches 4
// Flags: pathways_train --help (the workload flags are spmd_train's, from one definition).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "collectives/strings.h"
#include "common/check.h"
#include "common/trace.h"
#include "model/data.h"
#include "model/full_state.h"
#include "model/kernels.h"
#include "pathways/runtime.h"
#include "pathways/train/kernels.h"
#include "pathways/train/trainer.h"
#include "pathways/worker.h"

using namespace pwm;

namespace {

// Every rank must run the same configuration (the controller and each worker parse it): an MPMD
// launch with other flags on some rank would otherwise dispatch programs the workers shape
// differently. One 8-byte AllGather of a hash; the texts only to name the difference.
}  // namespace


int main(int argc, char** argv) {
  // Every node of a step allocates its outputs afresh (object-store buffers are values) and
  // frees its inputs' buffers when they die: keep large blocks in the heap, where freed memory
  // is reused, instead of mmap/munmap per buffer, which costs page faults and zeroing on every
  // step (in interleaved runs of the chained step at the reference config: 1002 -> 710 ms and
  // 1621 -> 899 ms per step on a busy machine).
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  collectives::MpiEnvironment env(&argc, &argv);
  collectives::Communicator world = collectives::Communicator::world(env.transport());
  model::TrainConfig cfg;
  pathways::train::PathwaysOptions po;
  int exit_code = 0;
  bool go = true;
  if (!collectives::agree_on_errors(world, "pathways_train", [&] {
        go = model::parse_train_config(
            argc, argv, "pathways_train",
            "Pathways trainer: a single controller (rank 0) dispatches the training step as programs to the worker ranks.",
            cfg, exit_code, env.rank() == 0, [&po](CLI::App& app) {
              const char* P = "Pathways";
              app.add_option("--granularity", po.granularity, "fused | chained | opbyop")
                  ->check(CLI::IsMember({"fused", "chained", "opbyop"}))->group(P);
              app.add_option("--stages", po.stages, "pipeline stages (> 1: MPMD pipeline, each stage a --dp x --tp slice)")->group(P);
              app.add_option("--schedule", po.schedule, "pipeline schedule: gpipe | 1f1b")
                  ->check(CLI::IsMember({"gpipe", "1f1b"}))->group(P);
              app.add_option("--islands", po.islands, "islands: KxM (K islands of M devices); default: one per host")->group(P);
              app.add_flag("--sequential", po.sequential, "sequential dispatch (the paper's baseline)")->group(P);
            });
      }))
    return 1;
  if (!go) return exit_code;
  std::shared_ptr<model::TextDataset> data;
  bool resume = false;
  const std::string host = env.processor_name();
  const auto hosts = collectives::allgather_strings(world, host);
  int workers_here = 0;  // the controller holds no tensors
  for (size_t r = 1; r < hosts.size(); ++r) workers_here += hosts[r] == host;
  const std::map<std::string, std::string> pathways_flags = {
      {"granularity", po.granularity}, {"stages", std::to_string(po.stages)}, {"schedule", po.schedule},
      {"islands", po.islands}, {"sequential", po.sequential ? "true" : "false"}};
  if (!collectives::agree_on_errors(world, "pathways_train",
                                    [&] {
                                      model::check_same_config(
                                          collectives::gather_if_different(world, cfg.canonical_json(pathways_flags)));
                                    }))
    return 1;
  if (!collectives::agree_on_errors(world, "pathways_train", [&] {
        const int workers = env.size() - 1;
        if (workers < 1) PWM_THROW("pathways_train needs a controller and at least one worker: mpirun -n 2 or more");
        if (po.stages < 1) PWM_THROW("--stages must be at least 1 (got {})", po.stages);
        if (cfg.fsdp)
          PWM_THROW("pathways_train does not shard parameters (--fsdp): leave it out (spmd_train runs --fsdp)");
        if (cfg.replicas > 1 && po.granularity == "opbyop")
          PWM_THROW("--replicas {} runs --granularity fused or chained, not opbyop", cfg.replicas);
        if (po.stages > 1) {
          if (po.stages > cfg.model.n_layers)
            PWM_THROW("--stages {} is more than --layers {}: each stage needs a layer", po.stages, cfg.model.n_layers);
          // Every replica is a pipeline of S stages, each a --dp x --tp slice.
          const int per_stage = cfg.dp * cfg.tp, need = cfg.replicas * po.stages * per_stage;
          if (workers != need)
            PWM_THROW("--stages {} needs {} workers ({}{} stages of --dp {} x --tp {} devices), but the job has {} (mpirun -n {})",
                      po.stages, need, cfg.replicas > 1 ? fmt::format("--replicas {} x ", cfg.replicas) : "", po.stages,
                      cfg.dp, cfg.tp, workers, need + 1);
          cfg.validate(cfg.replicas * per_stage);
        } else {
          cfg.validate(workers);  // dp x tp = the workers (world rank 0 is the controller)
        }
        cfg.validate_kill_rank(env.size());  // world ranks: 0 is the controller
        model::apply_precision(cfg);
        if (env.rank() != 0) model::check_memory(cfg, workers_here);
        if (env.rank() == 0) {
          model::check_output_paths(cfg);
          // The runtime's own trace (PWM_PW_TRACE) is written at shutdown, after the training:
          // check its path now, read where the runtime reads it.
          const std::string rt_trace = pathways::RuntimeOptions::from_env().trace_path;
          if (!rt_trace.empty()) check_output_path("PWM_PW_TRACE", rt_trace);
        }
        data = model::open_training_data(cfg);
        resume = model::load_resume_checkpoint(cfg).has_value();
      }))
    return 1;
  return collectives::run_mpi_main(env, [&] {
    if (env.rank() == 0) data.reset();  // the controller never touches tensor data
    // Every rank registers the kernels (the controller for their signatures); a worker also holds
    // its training device, which the kernels find by its world rank.
    auto devices = std::make_shared<pathways::train::DeviceSet>(cfg, pathways::train::PipelineShape{po.stages});
    pathways::train::register_train_kernels(pathways::train::KernelNames{}, devices);
    double peak = cfg.peak_gflops;
    if (peak <= 0) {  // the workers measure at once, as they will run; the controller idles
      peak = env.rank() == 0 ? 0.0 : model::measure_gemm_gflops();
      world.allreduce(&peak, &peak, 1, collectives::DataType::kFloat64, collectives::ReduceOp::kSum);
      peak /= env.size() - 1;
    }
    if (env.rank() != 0) {
      const auto attached = devices->attach(env.transport(), data);
      pathways::WorkerOptions wo = pathways::WorkerOptions::from_env();
      wo.timeout_s = cfg.coll_timeout;  // liveness: a silent controller ends the job after it
      pathways::run_worker(env.transport(), wo);
      return 0;
    }
    pathways::RuntimeOptions ro = pathways::RuntimeOptions::from_env();
    ro.islands = po.islands;
    ro.timeout_s = cfg.coll_timeout;  // liveness: a silent worker ends the job after it
    pathways::Runtime rt(env.transport(), ro);
    fmt::print("[pathways] controller + {} workers ({} islands) | {} | {} | batch {} x {} tokens, {} micro-batches | "
               "GEMM peak {:.1f} GFLOP/s per worker\n",
               env.size() - 1, rt.num_islands(),
               po.stages > 1 ? fmt::format("pipeline S={} {} of dp={} x tp={}{}", po.stages, po.schedule, cfg.dp, cfg.tp,
                                           cfg.replicas > 1 ? fmt::format(", replicas={}", cfg.replicas) : "")
                             : fmt::format("{} replicas={} dp={} tp={}", po.granularity, cfg.replicas, cfg.dp, cfg.tp),
               cfg.model.to_string(), cfg.global_batch, cfg.model.seq_len, cfg.microbatches, peak);
    if (cfg.precision != "fp32") fmt::print("[pathways] precision {}: {}\n", cfg.precision, model::bf16_info());
    pathways::Client client = rt.client("trainer");
    pathways::train::run_training(cfg, po, client, rt.num_islands(), peak, resume);
    rt.shutdown();
    return 0;
  });
}
