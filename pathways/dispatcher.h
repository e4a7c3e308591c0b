// Internal: the dispatcher, the controller's one MPI thread (controller.h has the thread-safe
// front). Each pass of its loop takes the clients' commands from the doorbell, polls the
// workers' answers, releases runs through the island schedulers and sends them, completes
// futures, and then sleeps as the sleep planner says. Its parts, each with its own contract:
//
//   doorbell.h              the command queue and the wake-up state shared with client threads
//   run_table.h             runs from submission to completion, in dispatch order
//   object_directory.h      where every object's shards are; frees; migrations on a drain
//   completion_predictor.h  when the runs on the devices will finish
//   sleep_planner.h         how long to sleep, from those predictions (a pure function)
//   controller_trace.h      the Perfetto trace written at shutdown
//   messages.h              one codec per wire message
//
// What stays here: accepting a run (validation, lowering on first use, back-pressure), handing
// it to the island schedulers, sending it (all stages at once, or stage after stage for
// sequential dispatch), the workers' answers, completion, fetches, puts, stats, drains,
// disconnections and deadlines (docs/pathways.md).
// Every method runs on the dispatcher thread, except hello() (on the thread that starts the
// Runtime, before the dispatcher thread exists).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pathways/backoff.h"
#include "pathways/completion_predictor.h"
#include "pathways/controller.h"
#include "pathways/controller_trace.h"
#include "pathways/doorbell.h"
#include "pathways/liveness.h"
#include "pathways/messages.h"
#include "pathways/object_directory.h"
#include "pathways/run_table.h"
#include "pathways/sleep_planner.h"

namespace pwm::pathways {

class Dispatcher {
 public:
  Dispatcher(Controller& c, collectives::Transport& t, Doorbell& bell);

  std::vector<std::string> hello();
  void init_schedulers(int islands);
  void loop();

  // ---- commands ----

  void run(std::shared_ptr<ProgramState> p, std::vector<std::shared_ptr<ArrayState>> in,
           std::vector<std::shared_ptr<ArrayState>> out, RunOptions o, uint64_t run_id, uint64_t owner, double weight);
  std::vector<ClientUsage> usage() const;
  uint64_t min_memory_cap() const;  // after hello()
  void put(std::shared_ptr<ArrayState> a, std::vector<std::vector<uint8_t>> shards);
  void fetch(std::shared_ptr<ArrayState> a, std::shared_ptr<FutureState<HostTensor>> f);
  void stats(std::shared_ptr<FutureState<std::vector<WorkerStats>>> f);
  void drain(int device, bool undrain, std::shared_ptr<FutureState<std::monostate>> f);
  void free_object(uint64_t id);
  void free_owner(uint64_t owner);
  void evict(const dataflow::LoweredProgram& lp);
  void begin_shutdown() { stopping_ = true; }
  // The world ranks lost (RuntimeOptions::survive_worker_loss); after the dispatcher has stopped.
  std::vector<int> lost() const { return {lost_.begin(), lost_.end()}; }

 private:
  struct FetchRec {
    std::shared_ptr<ArrayState> a;
    std::shared_ptr<FutureState<HostTensor>> f;
    std::vector<std::vector<uint8_t>> parts;
    size_t left = 0;
    std::string error;
  };
  struct FetchReq {
    std::shared_ptr<FetchRec> rec;
    size_t part;
    int rank;  // the worker asked
  };

  std::shared_ptr<dataflow::LoweredProgram> lowered(ProgramState& p);
  void pump_schedulers();
  void dispatch(RunRec& r);
  void release_stage(RunRec& r, uint32_t s);
  void handle(Message& m);
  void finish_fetch(FetchRec& rec);
  // A released run that cannot be sent (its client disconnected, or a device of its lowering was
  // lost): its outputs failed with `why`, its record dropped.
  void abandon(RunRec& r, const std::string& why);
  // Island ordering off: posts the runs staged in this pass, per worker grouped by client in
  // that worker's rotation of the clients.
  void post_staged();
  // Shutdown: true once every worker has left (after every run, fetch and stats request).
  bool shutdown_step(bool& any);
  // Plans and takes the sleep of a pass that found nothing to do.
  void sleep();

  // Every worker reported the run: complete its outputs once its inputs are resolved (a run
  // may finish before the run that produced its input reported a failure).
  void complete_workers(RunRec& r);
  bool try_complete(uint64_t id);
  void retry_fetches();
  void check_deadlines(double now);
  // Liveness (liveness.h): every quarter of the timeout, heartbeats to the workers and a check
  // that none has been silent for longer than the timeout (else the job is aborted, one line).
  void check_liveness(double now);
  std::string awaited_from(int rank);  // what this controller waits for from a worker, for that line
  // RuntimeOptions::survive_worker_loss: world rank `rank` is lost (dispatcher_liveness.cc).
  void lose(int rank, const std::string& why);
  // lose()'s runs: those it had a part in cancelled (sent) or abandoned at dispatch; every slice
  // of them renewed (a fresh context: its devices may have left collectives midway), and the
  // other runs on those slices ended as well (cancelled, or in stale_ until dispatch).
  void cancel_runs_of(int rank, const std::string& reason, const std::vector<SliceRemap>& plan);
  // The first of `ranks` that was lost, or -1 (at once when none was: on the dispatch path).
  template <typename Ranks>
  int lost_of(const Ranks& ranks) const {
    if (lost_.empty()) return -1;
    for (int r : ranks)
      if (lost_.count(r)) return r;
    return -1;
  }
  std::string lost_line(int rank) const;  // "device d (world rank r[ on host]) was lost"

  // Reclaiming retired context blocks (dispatcher_reclaim.cc, docs/pathways_liveness.md,
  // "Reclaiming a context"): the blocks the resource manager retired are counted by their live
  // members, drained, and returned to it. Every pass takes the newly retired ones (an atomic
  // load when there are none) and asks for the counts of those no unsent run uses any more; the
  // answers advance them; a loss takes the lost rank out of them.
  void start_reclaims();
  bool ask_counts(uint32_t block);  // false while a run not sent yet was lowered onto the block
  void reclaim_answer(const Message& m);
  void reclaim_lost(int rank);
  void reclaim_step(uint32_t block);
  struct Reclaim {
    std::vector<int> members;                // world ranks that report and drain (live members)
    std::vector<int> excluded;               // devices of the block lost on the way
    std::map<int, ContextCount> counts;      // by member: its answer to count_context
    std::set<int> draining;                  // members yet to answer drain_context
    bool asked = false, drain_sent = false;
  };
  std::map<uint32_t, Reclaim> reclaims_;     // by the block's first context
  size_t unasked_ = 0;                       // reclaims_ not asked yet (ask_counts)

  Controller& c_;
  const RuntimeOptions& opts_;
  collectives::Transport& t_;
  Channel chan_;
  Doorbell& bell_;
  Backoff backoff_;
  std::vector<int> workers_;
  std::vector<std::unique_ptr<IslandScheduler>> scheds_;
  RunTable runs_;
  ObjectDirectory objects_;
  CompletionPredictor predictor_;
  Liveness live_;
  ControllerTrace trace_;
  std::map<uint64_t, FetchReq> fetch_reqs_;
  std::vector<std::pair<std::shared_ptr<ArrayState>, std::shared_ptr<FutureState<HostTensor>>>> waiting_fetches_;
  std::map<uint64_t, std::pair<std::shared_ptr<FutureState<std::vector<WorkerStats>>>, std::vector<WorkerStats>>> stats_;
  std::map<int, uint64_t> caps_;                // world rank -> memory cap (0 = none)
  std::set<uint64_t> closed_;                   // disconnected clients
  std::map<uint64_t, std::string> stale_;       // unsent runs lowered for a renewed context: why they end
  std::set<int> lost_;                          // lost workers (survive_worker_loss)
  std::map<uint64_t, ClientUsage> usage_;       // by client id
  std::map<uint64_t, std::vector<std::weak_ptr<ProgramState>>> programs_by_owner_;
  std::map<int, std::vector<std::pair<uint64_t, std::vector<uint8_t>>>> staged_;  // rank -> (client, kRun body)
  // The sleep planner's inputs and scratch, reused: no allocation per sleep.
  std::vector<AwaitedRun> awaited_scratch_;
  std::vector<PendingFetch> fetch_scratch_;
  std::vector<double> plan_scratch_;
  uint64_t next_req_ = 1;
  uint32_t next_xfer_base_ = 0;  // data tags are handed out in dispatch order (tags::data_tag)
  bool stopping_ = false, shutdown_sent_ = false, urgent_activity_ = false;
};

}  // namespace pwm::pathways
