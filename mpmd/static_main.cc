// mpmd_train: the static model (controller-less MPMD): every rank builds the same step program,
// lowers it with the same mapping, and runs its own part in the program's order:
//   mpirun -n 2 mpmd_train --dp 2 --granularity chained --steps 50 --metrics m.jsonl
// Flags: mpmd_train --help (the workload flags are spmd_train's: train/flags.h). Start-up and
// the run loop are the shared ones (train/bootstrap.h, train/loop.h).

#include <memory>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "collectives/strings.h"
#include "common/check.h"
#include "mpmd/startup.h"
#include "mpmd/static_backend.h"
#include "mpmd/trainer.h"
#include "programs/kernels.h"

using namespace pwm;

int main(int argc, char** argv) {
  mpmd::keep_large_blocks_in_heap();
  collectives::MpiEnvironment env(&argc, &argv);
  train::Startup s;
  bool resume = false;
  if (const auto code = mpmd::start(argc, argv, env, mpmd::static_spec(), s, resume)) return *code;
  return collectives::run_mpi_main(env, [&] {
    auto devices = std::make_shared<programs::DeviceSet>(s.cfg, programs::PipelineShape{s.cfg.mpmd.stages});
    programs::register_train_kernels(programs::KernelNames{}, devices);
    const auto attached = devices->attach(env.transport(), s.data);
    collectives::Communicator world = collectives::Communicator::world(env.transport());
    std::string stopped;
    {
      mpmd::StaticBackend backend(s.cfg, env.transport());
      mpmd::Trainer trainer(s.cfg, backend, resume);
      const auto& m = s.cfg.mesh;
      train::print_header("static",
                          fmt::format("{} ranks, no controller | {} dp={} tp={}", env.size(),
                                      train::name(s.cfg.mpmd.granularity), m.dp, m.tp),
                          s.cfg, "", trainer.report().peak(), "rank");
      if (resume && env.rank() == 0)
        fmt::print("[{}] resumed from {} at step {}\n", mpmd::run_name(s.cfg, mpmd::Model::kStatic), s.cfg.outputs.ckpt,
                   trainer.first_step());
      if (!trainer.run()) stopped = trainer.stop_error();
    }
    // A run stopped at a non-finite step: the same line on every rank; printed once, exit 1.
    return collectives::agree_on_errors(world, "mpmd_train", [&] {
      if (!stopped.empty()) throw Error(stopped);
    }) ? 0 : 1;
  });
}
