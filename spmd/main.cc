// spmd_train: the SPMD / BSP multi-controller trainer. Every rank runs this program.
//   mpirun -n 2 spmd_train --dp 2 --steps 50 --metrics m.jsonl --trace t.json
// Flags: spmd_train --help (the workload flags are shared with pathways_train).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "collectives/strings.h"
#include "common/check.h"
#include "common/trace.h"
#include "model/data.h"
#include "model/full_state.h"
#include "model/kernels.h"
#include "model/train_config.h"
#include "spmd/trainer.h"

using namespace pwm;

namespace {

// Every rank must run the same configuration: ranks of an MPMD launch (`mpirun -n 1 spmd_train
// --seed 1 : -n 1 spmd_train --seed 2`) would otherwise train apart silently or, with another
// --bucket-bytes, post collectives of other sizes. One 8-byte AllGather of a hash; the texts are
// exchanged only to name the difference. Throws on every rank with the same message.
// Every rank's processor name, index = world rank.
std::vector<std::string> all_hosts(collectives::Communicator& world, const std::string& host) {
  return collectives::allgather_strings(world, host);
}

// One line naming the replicas whose ranks are on more than one host (their dp and tp
// collectives then cross hosts too, not only the replica exchange); empty if none.
std::string replicas_spanning_hosts(const model::TrainConfig& cfg, const std::vector<std::string>& hosts) {
  const int per = cfg.dp * cfg.tp;
  std::vector<std::string> spans;
  for (int r = 0; r < cfg.replicas && (r + 1) * per <= static_cast<int>(hosts.size()); ++r) {
    std::vector<std::string> mine(hosts.begin() + r * per, hosts.begin() + (r + 1) * per);
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    if (mine.size() > 1) spans.push_back(fmt::format("replica {} ({})", r, fmt::join(mine, ", ")));
  }
  if (spans.empty()) return "";
  return fmt::format("[spmd] note: not on one host: {}; its dp/tp collectives cross hosts", fmt::join(spans, "; "));
}

}  // namespace


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
  const std::vector<std::string> hosts = all_hosts(world, env.processor_name());
  const int host_ranks = static_cast<int>(std::count(hosts.begin(), hosts.end(), env.processor_name()));
  if (!collectives::agree_on_errors(world, "spmd_train", [&] {
        model::check_same_config(collectives::gather_if_different(world, cfg.canonical_json()));
      }))
    return 1;
  if (!collectives::agree_on_errors(world, "spmd_train", [&] {
        cfg.validate(env.size());
        cfg.validate_kill_rank(env.size());
        model::apply_precision(cfg);
        model::check_memory(cfg, host_ranks);
        if (env.rank() == 0) model::check_output_paths(cfg);
        data = model::open_training_data(cfg);
        resume_from = model::load_resume_checkpoint(cfg);
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
      fmt::print("[spmd] {} ranks: replicas={} dp={}{} tp={}{} | {} | batch {} x {} tokens, {} micro-batches | data {} ({} bytes) | "
                 "GEMM peak {:.1f} GFLOP/s per rank\n",
                 env.size(), cfg.replicas, cfg.dp, cfg.fsdp ? " (fsdp)" : "", cfg.tp,
                 cfg.replicas > 1 ? fmt::format(" ({} replica reduce)", cfg.replica_reduce) : "", cfg.model.to_string(), cfg.global_batch, cfg.model.seq_len,
                 cfg.microbatches, cfg.data, data->size(), peak);
    if (env.rank() == 0 && cfg.precision != "fp32")
      fmt::print("[spmd] precision {}: {}\n", cfg.precision, model::bf16_info());
    if (env.rank() == 0) {
      const std::string spans = replicas_spanning_hosts(cfg, hosts);
      if (!spans.empty()) fmt::print("{}\n", spans);
    }
    spmd::Trainer trainer(cfg, env.transport(), *data, peak, resume_from);
    resume_from.reset();  // the trainer has its shard; free the full copy
    // An output that could not be written (a full disk) was reported by rank 0 as one line and
    // ended the run on every rank together.
    return trainer.run() ? 0 : 1;
  });
}
