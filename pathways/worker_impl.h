// Internal to the worker (worker.h states the contract; docs/pathways_wire.md the protocol): the
// worker's state and the members its three sources share, one Worker per worker rank, used by
// that rank's one thread.
//   worker.cc            the loop, the controller's messages, loading programs
//   worker_runs.cc       runs: admission under the memory cap, and the worker as the host of
//                        each run's walk (dataflow/interpreter.h: the instruction-list
//                        interpreter the static model's executor shares)
//   worker_transfers.cc  bytes between workers outside runs: moves and fetches
#pragma once

#include <fmt/format.h>

#include <deque>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "common/check.h"
#include "common/time.h"
#include "pathways/backoff.h"
#include "pathways/liveness.h"
#include "pathways/messages.h"
#include "pathways/object_store.h"
#include "pathways/worker.h"
#include "pathways/worker_run.h"
#include "pathways/worker_trace.h"

namespace pwm::pathways::worker_detail {

class Worker {
 public:
  Worker(std::shared_ptr<collectives::Transport> t, WorkerOptions o)
      : t_(std::move(t)), chan_(*t_), rank_(t_->rank()), device_(rank_ - 1),
        backoff_(o.latency.worker_backoff_min_us, o.latency.worker_backoff_max_us, o.latency.worker_spins), opts_(o),
        comms_(t_, comm_options(o)), long_kernel_s_(1e-6 * o.latency.long_kernel_us), live_(o.timeout_s, {0}, now_s()) {
    PWM_CHECK(rank_ != 0, "run_worker on the controller rank");
    // A kernel waiting in a collective still beats (liveness.h): the controller must not take
    // a worker waiting for a stopped peer for the stopped one.
    t_->set_wait_hook([this] {
      const double now = now_s();
      if (live_.due(now)) beat();
      if (opts_.interruptible && kernel_run_ != 0) poll_in_kernel(now);
    });
  }
  ~Worker() { t_->set_wait_hook({}); }

  // Runs until the controller's shutdown (and this worker's last runs, moves and fetches) or a
  // fatal error (which aborts the job).
  void loop();
  const std::vector<int>& lost() const { return lost_; }  // what the shutdown said (run_worker)

 private:
  static collectives::CommOptions comm_options(const WorkerOptions& o) {
    collectives::CommOptions c = collectives::CommOptions::from_env();
    if (o.collective_timeout_s > 0) c.timeout_s = o.collective_timeout_s;
    return c;
  }
  std::string where() const { return fmt::format("device {} (world rank {})", device_, rank_); }
  // where() with this worker's host, for the lines that end the job.
  std::string where_on_host() const { return fmt::format("device {} (world rank {}{})", device_, rank_, on_host(rank_)); }
  std::string on_host(int rank) const { return t_->on_host(rank); }

  // A heartbeat to the controller (liveness.h), sent at once.
  void beat() {
    chan_.post(0, MsgType::kHeartbeat);
    chan_.flush();
  }

  // From a kernel's collective wait (WorkerOptions::interruptible): reads the controller's
  // messages into held_ (handled by the loop after the kernel, in order), acts on an eviction at
  // once, and throws collectives::Interrupted once the running kernel's run is cancelled.
  void poll_in_kernel(double now);

  // The controller has been silent past the liveness timeout: one line naming what this worker
  // waits for, and the job ends.
  [[noreturn]] void controller_silent(double now);
  // Evict: this worker was declared lost; one line and exit(1) (worker.cc).
  [[noreturn]] void evicted(const std::string& why);
  // What a stats request is answered with: this worker's store, runs and memory now.
  WorkerStats stats() const;
  // One message from the controller (worker_runs.cc and worker_transfers.cc do the work).
  void handle(Message& m);

  // An admitted run: its slots bound (inputs from the store, outputs made; a run's intermediates
  // take memory at first write, or at once under a memory cap); progress_run does the rest.
  void start_run(RunHeader h, std::shared_ptr<const LoadedProgram> prog);

  bool queued(uint64_t run_id) const {
    for (auto& q : queued_)
      if (q.first.run_id == run_id) return true;
    return false;
  }

  // Starts queued runs in arrival order while their buffers fit under the memory cap (all of
  // them without a cap). A run that could never fit is started to fail at once.
  bool admit();

  void note_error(Run& run, const std::string& e) {
    if (run.error.empty()) run.error = e;
  }

  // One pass over a run's walk (dataflow/interpreter.h; this worker its WalkHost), never
  // blocking except inside a kernel; true if anything moved.
  bool progress_run(Run& run);
  class Host;  // the WalkHost of one run (worker_runs.cc)

  void node_event(Run& run, uint32_t node, bool started) {
    chan_.send(0, NodeEvent{run.h.run_id, node, started});
    chan_.flush();  // now: the controller must hear of a start while the kernel runs
  }

  // CancelRun: the run stops where it is (another device of it was lost). Its posted receives
  // are withdrawn and its other transfers abandoned (the transport keeps them and their buffers
  // until MPI is done with them: Transport::abandon), its kernels not yet run never run, its
  // unwritten values fail with `reason`; finish_run then answers run_done.
  void cancel_run(Run& run, const std::string& reason);

  void finish_run(Run& run) {
    chan_.send(0, RunDone{run.h.run_id, run.first_error(), run.kernel_s});  // (the run ends here)
    if (run.h.flags & kRunAwaited) awaited_done_ = true;
  }

  // Moves between programs (kMoveOut/kMoveIn) and the controller's fetches: progressed without
  // blocking, true if anything moved.
  bool progress_moves();
  bool progress_fetches();
  // Reclaiming retired context blocks (count_context, drain_context): answers the counts of a
  // block once no run here uses it, and progresses the drains (never blocking); a drained block's
  // communicators are dropped (comms_, WorkerOptions::on_context_reclaimed) before it is
  // reported drained. True if anything moved.
  bool progress_reclaims();
  bool uses_block(uint32_t first) const;  // a run (started or queued) has a kernel on the block
  // drain_context: starts the block's drains (progressed by progress_reclaims), or, flagged
  // give_up, stops waiting for a lost peer's messages in a drain under way.
  void start_drain(const DrainContext& d);

  std::shared_ptr<collectives::Transport> t_;
  Channel chan_;
  int rank_, device_;
  Backoff backoff_;
  WorkerOptions opts_;
  double last_active_ = now_s();
  bool shutdown_ = false;
  ObjectStore store_;
  dataflow::LiveBytes inter_;  // bytes of runs' intermediates (before runs_: their walks count down into it)
  std::map<uint64_t, std::shared_ptr<const LoadedProgram>> programs_;
  std::list<Run> runs_;
  std::list<Move> moves_;
  std::list<Fetch> fetches_;
  std::vector<int> lost_;  // the world ranks the controller lost (its shutdown message)
  dataflow::SliceComms comms_;
  std::set<uint32_t> to_count_;  // blocks whose counts the controller asked for, not answered yet
  std::map<uint32_t, std::vector<collectives::ContextDrain>> draining_;  // block -> its contexts' drains
  std::set<uint64_t> pending_execs_;
  std::deque<std::pair<RunHeader, std::shared_ptr<const LoadedProgram>>> queued_;  // not started, arrival order
  std::set<uint64_t> early_freed_;             // outputs of queued runs already freed
  std::map<uint64_t, uint32_t> early_release_; // stage releases of queued sequential runs
  std::map<uint64_t, std::string> cancelled_;   // queued runs cancelled (kRunCancelled): why
  WorkerTrace trace_;
  uint64_t peak_bytes_ = 0;
  // kRunInOrder: a receive is posted when at most this many kernels before it are left.
  static constexpr uint32_t kInOrderRecvAhead = 8;
  bool awaited_done_ = false;  // a run_done of a kAwaited run is posted, not yet flushed
  bool long_kernel_ran_ = false;  // in this pass of loop()
  const double long_kernel_s_;  // LatencyPolicy::long_kernel_us, in seconds
  uint64_t next_order_ = 0;
  uint64_t kernels_run_ = 0;
  Liveness live_;  // the controller's silence; our heartbeats
  // poll_in_kernel: the run whose kernel is running (0: none), the messages read inside it, the
  // runs whose cancel was read there (until the loop handles it: their kernels do not start),
  // and when it next polls (every millisecond at most).
  uint64_t kernel_run_ = 0;
  std::vector<Message> held_;
  std::map<uint64_t, std::string> interrupted_;
  double next_poll_ = 0;
};

}  // namespace pwm::pathways::worker_detail
