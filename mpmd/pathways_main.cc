// pathways_train: the same Transformer and workload as spmd_train, run as Pathways programs by a
// single controller (world rank 0) over N worker ranks:
//   mpirun -n 3 pathways_train --dp 2 --granularity fused --steps 50 --metrics m.jsonl
//   mpirun -n 3 pathways_train --stages 2 --islands 2x1 --microbatches 8 --schedule 1f1b
//   mpirun -n 5 pathways_train --replicas 2 --stages 2 --islands 2x2 --microbatches 4
// Flags: pathways_train --help (the workload flags are spmd_train's: train/flags.h). Start-up
// and the run loop are the shared ones (train/bootstrap.h, train/loop.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "collectives/strings.h"
#include "common/check.h"
#include "mpmd/pathways_backend.h"
#include "mpmd/startup.h"
#include "pathways/liveness.h"
#include "pathways/tags.h"
#include "pathways/worker.h"
#include "programs/kernels.h"

using namespace pwm;

int main(int argc, char** argv) {
  mpmd::keep_large_blocks_in_heap();
  collectives::MpiEnvironment env(&argc, &argv);
  train::Startup s;
  bool resume = false;
  if (const auto code = mpmd::start(argc, argv, env, mpmd::pathways_spec(), s, resume)) return *code;
  return collectives::run_mpi_main(env, [&] {
    if (env.rank() == 0) s.data.reset();  // the controller never touches tensor data
    // Every rank registers the kernels (the controller for their signatures); a worker also holds
    // its training device, which the kernels find by its world rank.
    // --spare-workers: a worker's kernels can be interrupted by the controller's cancel (a device
    // of the slice was lost), and their collectives' watchdog, a backstop behind the
    // controller's verdict, waits longer than the liveness timeout (pathways/liveness.h).
    const bool interruptible = s.cfg.mpmd.spare_workers > 0;
    const double kernel_timeout = s.cfg.exec.coll_timeout * (interruptible ? pathways::kInterruptibleWatchdogFactor : 1);
    train::TrainConfig device_cfg = s.cfg;
    device_cfg.exec.coll_timeout = kernel_timeout;
    auto devices = std::make_shared<programs::DeviceSet>(device_cfg, programs::PipelineShape{s.cfg.mpmd.stages});
    programs::register_train_kernels(programs::KernelNames{}, devices);
    collectives::Communicator world = collectives::Communicator::world(env.transport());
    // A run stopped at a non-finite step: the controller has ended the metrics and shut the
    // runtime down; it prints the line once and every rank exits 1, as a bad start-up does.
    std::string stopped;
    std::vector<int> lost;  // --spare-workers: the workers lost on the way (dead: left out below)
    if (env.rank() == 0) {
      // (The GEMM peak is probed on the workers by the trainer, through the runtime: waiting in
      // the runtime, the controller leaves the cores to the probing workers.)
      stopped = mpmd::run_controller(env.transport(), s.cfg, resume, &lost,
                                                [devices](int replicas) { devices->set_replicas(replicas); });
    } else {
      const auto attached = devices->attach(env.transport(), s.data);
      pathways::WorkerOptions wo = pathways::WorkerOptions::from_env();
      wo.timeout_s = s.cfg.exec.coll_timeout;  // liveness: a silent controller ends the job after it
      wo.interruptible = interruptible;
      wo.collective_timeout_s = kernel_timeout;
      if (interruptible) wo.on_cancel = [devices, rank = env.rank()] { devices->at(rank).abandon_step(); };
      wo.on_context_reclaimed = [devices, rank = env.rank()](uint32_t first, uint32_t n) {
        devices->at(rank).forget_contexts(first, n);
      };
      pathways::run_worker(env.transport(), wo, &lost);
    }
    std::optional<collectives::Communicator> survivors;  // (the ranks left, on a context of their own)
    if (!lost.empty()) {
      std::vector<int> alive;
      for (int r = 0; r < env.size(); ++r)
        if (std::find(lost.begin(), lost.end(), r) == lost.end()) alive.push_back(r);
      survivors.emplace(env.transport(), alive, pathways::tags::kUserContextBase);
    }
    const bool ok = collectives::agree_on_errors(survivors ? *survivors : world, "pathways_train", [&] {
      if (!stopped.empty()) throw Error(stopped);
    });
    if (survivors) {
      // A rank was lost: OpenMPI 4.1.4's MPI_Finalize waits in a fence of every rank, the lost
      // one included, and hung in 1 of 8 runs here. The survivors have agreed and every output
      // is written and closed: they end without it (mpirun --enable-recovery takes that as it
      // takes the lost rank).
      std::fflush(stdout);
      std::fflush(stderr);
      // A lost rank that was stopped or cut off (not dead) still runs as far as the launcher
      // knows, and mpirun would wait for it for ever. MPI_Abort is the one call MPI has that
      // ends a process the job cannot reach; the controller makes it once everything is written.
      // (Code 0 after a run that ended well, else 1; supervise.sh --done-file reads the outcome.)
      // The line ends in "; aborting the job", the project's mark of a job ending itself, which
      // launch_watch.sh (cluster.sh's launches) watches for: a cut host's daemon cannot be
      // reached, so mpirun's abort never completes and the watch has to end the launch. OpenMPI's
      // own "MPI_ABORT was invoked" banner cannot be relied on for that: with --enable-recovery,
      // mpirun 4.1.4 drops it in 5-30% of runs here ("ORTE_ERROR_LOG: Data unpack would read past
      // end of buffer in file orte/util/show_help.c", docs/failures.md), and a launch that waited
      // for the banner alone outlived the job until cluster.sh's timeout.
      if (env.rank() == 0)
        collectives::MpiEnvironment::abort_job(
            fmt::format("pathways_train: the run {}; ending world rank(s) {} that were lost (a stopped or cut-off rank "
                        "would keep the launcher waiting); aborting the job",
                        ok ? "is done and written" : "ended with the error above", fmt::join(lost, ", ")),
            ok ? 0 : 1);
      std::_Exit(ok ? 0 : 1);
    }
    return ok ? 0 : 1;
  });
}
