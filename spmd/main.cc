// spmd_train: the SPMD / BSP multi-controller trainer. Every rank runs this program.
//   mpirun -n 2 spmd_train --dp 2 --steps 50 --metrics m.jsonl --trace t.json
// Flags: spmd_train --help (the workload flags are shared with pathways_train: train/flags.h).
// Start-up and the run loop are the shared ones (train/bootstrap.h, train/loop.h).
#include <fmt/format.h>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "spmd/trainer.h"
#include "train/bootstrap.h"

using namespace pwm;

namespace {

// "[spmd] N ranks: replicas=R dp=D (fsdp) tp=T (hierarchical replica reduce) | ...", and a note
// when a replica's ranks span hosts.
void print_header(const train::Startup& s, int ranks, const train::Peak& peak) {
  const train::TrainConfig& cfg = s.cfg;
  const std::string reduce =
      cfg.mesh.replicas > 1 ? fmt::format(" ({} replica reduce)", train::name(cfg.exec.replica_reduce)) : "";
  train::print_header("spmd",
                      fmt::format("{} ranks: replicas={} dp={}{} tp={}{}", ranks, cfg.mesh.replicas, cfg.mesh.dp,
                                  cfg.mesh.fsdp ? " (fsdp)" : "", cfg.mesh.tp, reduce),
                      cfg, fmt::format("data {} ({} bytes) | ", cfg.workload.data, s.data->size()), peak, "rank");
  const std::string spans = spmd::replicas_spanning_hosts(cfg, s.hosts);
  if (!spans.empty()) fmt::print("{}\n", spans);
}

}  // namespace

int main(int argc, char** argv) {
  collectives::MpiEnvironment env(&argc, &argv);
  train::Startup s;
  if (const auto code = train::bootstrap(argc, argv, env, spmd::trainer_spec(), s)) return *code;
  return collectives::run_mpi_main(env, [&] {
    collectives::Communicator world = collectives::Communicator::world(env.transport());
    // Every rank's probe of its step's products: at start-up here, through the run in the trainer.
    std::unique_ptr<model::GemmProbe> probe = train::make_gemm_probe(s.cfg);
    const train::Peak peak = train::gemm_peak(world, s.cfg, probe.get());
    if (env.rank() == 0) print_header(s, env.size(), peak);
    spmd::Trainer trainer(s.cfg, env.transport(), *s.data, peak, std::move(probe), s.resume_from);
    s.resume_from.reset();  // the trainer has its shard; free the full copy
    // An output that could not be written (a full disk) was reported by rank 0 as one line and
    // ended the run on every rank together.
    return trainer.run() ? 0 : 1;
  });
}
