// The Pathways runtime: world rank 0 is the controller, every other rank a worker (one device).
//
//   int main(int argc, char** argv) {
//     collectives::MpiEnvironment env(&argc, &argv);
//     return collectives::run_mpi_main(env, [&] {
//       register_my_kernels();                       // on every rank, before anything else
//       if (env.rank() != 0) { pathways::run_worker(env.transport()); return 0; }
//       pathways::Runtime rt(env.transport(), opts);  // blocks until every worker said hello
//       ... clients ...
//       rt.shutdown();                                // every worker returns from run_worker
//       return 0;
//     });
//   }
//
// The Runtime owns the dispatcher thread, the only thread on rank 0 that calls MPI (MPI is
// initialized MPI_THREAD_SERIALIZED; the constructor's handshake runs on the calling thread
// before the dispatcher starts). Clients enqueue work to it and wait on condition variables; the
// dispatcher polls MPI and, when a pass finds nothing, sleeps on its doorbell's condition
// variable for as long as RuntimeOptions::latency allows (sleep_planner.h): it never spins.
#pragma once

#include <memory>
#include <string>

#include "collectives/transport.h"
#include "pathways/client.h"
#include "pathways/latency.h"
#include "pathways/scheduler.h"

namespace pwm::pathways {

struct RuntimeOptions {
  std::string islands;                // "" = one island per host; "KxM" = K islands of M devices
  LatencyPolicy latency;              // the dispatcher's polling and sleeping (latency.h)
  SchedulerFactory scheduler;         // per island; empty = FIFO (PWM_PW_SCHEDULER=fifo|share[:N])
  // false: no island order (the deadlock demonstration). Each worker gets the runs released in
  // one dispatcher pass grouped by client in its own rotation of the clients, as independent
  // controllers would post them, and runs a ready gang node at once instead of in arrival order.
  // Programs with collectives on overlapping slices then deadlock (PWM_PW_ISLAND_ORDERING=0).
  bool island_ordering = true;
  // Non-empty: the controller and the workers record every kernel execution and dispatch, and
  // shutdown() writes one Perfetto (Chrome JSON) trace there: one row per device, each slice
  // named after the client whose node it is (PWM_PW_TRACE).
  std::string trace_path;
  // Liveness (liveness.h): a worker heard from by no message for this long while the runtime
  // runs is stopped, dead or stuck, and the job is aborted with one line naming it. The
  // collectives' watchdog timeout by default (PWM_COLL_TIMEOUT, 300 s); pathways_train passes
  // --coll-timeout.
  double timeout_s = 300;
  // true: a silent worker is lost, not fatal (docs/failures.md, "Recovery in the job"): the
  // dispatcher says so in one line, drains its device (the resource manager remaps its slices
  // onto spare devices of the same island, or the job ends when there is none), cancels the
  // runs it had a part in on the other workers and fails their outputs, and fails every object
  // it held; the client sees failed arrays and recovers (pathways_train --spare-workers). Needs
  // an MPI library that keeps the job alive when a rank dies (OpenMPI's mpirun
  // --enable-recovery); without one, the launcher ends the job first.
  bool survive_worker_loss = false;
  // With survive_worker_loss: a slice left with no spare device keeps its lost device
  // (Slice::lost()) and the job goes on, instead of ending with the loss's line; the client drops
  // the slice (pathways_train: one replica fewer) or ends the job.
  bool survive_without_spare = false;

  // The defaults with the PWM_PW_* environment settings applied (latency: LatencyPolicy::from_env()).
  static RuntimeOptions from_env();
};

class Runtime {
 public:
  // World rank 0 only. Blocks until every worker has said hello; throws pwm::Error on a bad
  // islands spec or a transport whose tag space is too small.
  explicit Runtime(std::shared_ptr<collectives::Transport> transport, RuntimeOptions options = RuntimeOptions::from_env());
  ~Runtime();  // shutdown()
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Client client(const std::string& name = "");
  Client client(const std::string& name, ClientOptions options);
  // Per client, in creation order (disconnected clients included). Blocks until the dispatcher
  // answers (after everything queued before).
  std::vector<ClientUsage> usage();
  // The smallest per-worker object-store memory cap (WorkerOptions::memory_cap_bytes), 0 = none.
  uint64_t memory_cap_bytes() const;
  const char* scheduler_name() const;
  int num_devices() const;
  int num_islands() const;
  std::string describe() const;
  // Waits for every run in flight, stops every worker (their run_worker returns) and the
  // dispatcher. Idempotent. Work submitted afterwards fails.
  void shutdown();
  // After shutdown(): the world ranks of the workers lost on the way (survive_worker_loss), in
  // order. The workers that left normally were told (run_worker returns the same list), so that
  // whatever the job does next (a final agreement, MPI_Finalize) leaves the lost ones out.
  std::vector<int> lost_workers() const;

 private:
  std::shared_ptr<Controller> c_;
};

}  // namespace pwm::pathways
