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

namespace {

// Runs `fn` on every rank and agrees on the outcome: if any rank failed, the lowest failing
// rank's message is printed once (by rank 0) and every rank returns false. Used for bad input,
// so that a mistake gives one line and a non-zero exit everywhere, not a hang or an abort banner.
bool preflight(collectives::Communicator& world, const std::function<void()>& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  auto all = collectives::allgather_strings(world, err);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) {
      if (world.rank() == 0) {
        std::fprintf(stderr, "spmd_train: error: %s\n", all[r].c_str());
        std::fflush(stderr);
      }
      return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  collectives::MpiEnvironment env(&argc, &argv);
  collectives::Communicator world = collectives::Communicator::world(env.transport());
  model::TrainConfig cfg;
  int exit_code = 0;
  bool go = true;
  if (!preflight(world, [&] {
        go = model::parse_train_config(argc, argv, "spmd_train",
                                       "SPMD/BSP trainer: every rank runs the same step; gradients meet in a "
                                       "bucketed AllReduce.",
                                       cfg, exit_code, env.rank() == 0);
      }))
    return 1;
  if (!go) return exit_code;
  if (cfg.data.empty()) cfg.data = model::default_corpus_path();
  std::unique_ptr<model::TextDataset> data;
  std::optional<model::Checkpoint> resume_from;
  if (!preflight(world, [&] {
        cfg.validate(env.size());
        data = std::make_unique<model::TextDataset>(model::TextDataset::open(cfg.data, cfg.val_fraction));
        data->check_fits(cfg.model.seq_len);
        if (data->num_val_batches(cfg.global_batch, cfg.model.seq_len) < 1)
          PWM_THROW("--data {}: the validation split ({} bytes) holds fewer than --batch {} windows of {} tokens; "
                    "use more data, a larger --val-fraction or a smaller --batch",
                    cfg.data, data->val_size(), cfg.global_batch, cfg.model.seq_len + 1);
        resume_from = model::load_resume_checkpoint(cfg);
        if (env.rank() == 0) {
          if (!cfg.metrics.empty()) check_writable("--metrics", cfg.metrics);
          if (!cfg.trace.empty()) check_writable("--trace", cfg.trace);
          if (!cfg.ckpt.empty()) check_writable("--ckpt", cfg.ckpt);
        }
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
