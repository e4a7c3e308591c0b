// spmd_train: the SPMD / BSP multi-controller trainer. Every rank runs this program.
//   mpirun -n 2 spmd_train --dp 2 --steps 50 --metrics m.jsonl --trace t.json
// Flags: spmd_train --help (the workload flags are shared with pathways_train).
#include <fmt/format.h>

#include <cstdio>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "collectives/strings.h"
#include "common/check.h"
#include "common/trace.h"
#include "model/data.h"
#include "model/full_state.h"
#include "model/train_config.h"
#include "spmd/trainer.h"

using namespace pwm;


int main(int argc, char** argv) {
  collectives::MpiEnvironment env(&argc, &argv);
  collectives::Communicator world = collectives::Communicator::world(env.transport());
  model::TrainConfig cfg;
  int exit_code = 0;
  bool go = true;
  if (!collectives::agree_on_errors(world, "spmd_train", [&] {
        go = model::parse_train_config(argc, argv, "spmd_train",
                                       "SPMD/BSP trainer: every rank runs the same step; gradients meet in a "
                                       "bucketed AllReduce.",
                                       cfg, exit_code, env.rank() == 0);
      }))
    return 1;
  if (!go) return exit_code;
  std::unique_ptr<model::TextDataset> data;
  std::optional<model::Checkpoint> resume_from;
  if (!collectives::agree_on_errors(world, "spmd_train", [&] {
        cfg.validate(env.size());
        data = model::open_training_data(cfg);
        resume_from = model::load_resume_checkpoint(cfg);
        if (env.rank() == 0) model::check_output_paths(cfg);
      }))
    return 1;
  return collectives::run_mpi_main(env, [&] {
    double peak = cfg.peak_gflops;
    if (peak <= 0) {  // every rank measures at once, as it will run: one core each
      peak = model::measure_gemm_gflops();
      world.allreduce(&peak, &peak, 1, collectives::DataType::kFloat64, collectives::ReduceOp::kSum);
      peak /= world.size();
    }
    if (env.rank() == 0)
      fmt::print("[spmd] {} ranks: dp={} tp={} | {} | batch {} x {} tokens, {} micro-batches | data {} ({} bytes) | "
                 "GEMM peak {:.1f} GFLOP/s per rank\n",
                 env.size(), cfg.dp, cfg.tp, cfg.model.to_string(), cfg.global_batch, cfg.model.seq_len,
                 cfg.microbatches, cfg.data, data->size(), peak);
    spmd::Trainer trainer(cfg, env.transport(), *data, peak, resume_from);
    resume_from.reset();  // the trainer has its shard; free the full copy
    trainer.run();
    return 0;
  });
}
