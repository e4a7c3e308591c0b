// Internal: the dispatcher, the controller's one MPI thread (controller.h has the thread-safe
// front). It lowers programs (once per program and slice mapping), hands runs to the island
// schedulers, sends each released run to its workers (all stages at once, or stage after stage
// for sequential dispatch), completes the client's futures from the workers' answers, frees
// objects, migrates them on a drain, and reports missed deadlines (docs/pathways.md).
// Every method runs on the dispatcher thread, except hello() (on the thread that starts the
// Runtime, before the dispatcher thread exists).
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/env.h"
#include "pathways/backoff.h"
#include "pathways/controller.h"
#include "pathways/messages.h"

namespace pwm::pathways {


struct RunRec {
  uint64_t id = 0;
  std::shared_ptr<ProgramState> prog;
  std::shared_ptr<LoweredProgram> lp;
  std::vector<std::shared_ptr<ArrayState>> in, out;
  RunOptions opts;
  uint64_t owner = 0;
  double weight = 1;
  bool sent = false;                  // kRun posted to the workers
  std::vector<uint64_t> early_frees;  // outputs freed before the run was sent (freed after it)
  double kernel_s = 0;                // summed kernel durations reported by the workers
  int islands_pending = 0;
  std::set<int> waiting;       // ranks that have not reported the run done
  std::string error;           // first error reported by a worker
  bool workers_done = false;
  bool expired = false;        // deadline missed: outputs already failed
  double deadline = 0;         // absolute (now_s), 0 = none
  double dispatched = 0;       // now_s() when sent to the workers
  double predicted_done = 0;   // predicted completion on the devices (predict(); 0: unknown)
  uint32_t stage = 0;          // sequential: the stage released last
  std::set<int> stage_waiting;
  std::map<std::pair<int, uint32_t>, double> running;  // (rank, node) -> start time
  std::set<std::pair<int, uint32_t>> finished;
};

struct ObjMeta {
  int slice = 0;
  ArgSpec spec;
  std::vector<int> ranks;
  uint64_t owner = 0;
};

struct FetchRec {
  std::shared_ptr<ArrayState> a;
  std::shared_ptr<FutureState<HostTensor>> f;
  std::vector<std::vector<uint8_t>> parts;
  size_t left = 0;
  std::string error;
};

class Dispatcher {
 public:
  Dispatcher(Controller& c, collectives::Transport& t)
      : c_(c), t_(t), chan_(t), backoff_(c.opts_.backoff_min_us, c.opts_.backoff_max_us) {
    for (int r = 1; r < t_.size(); ++r) workers_.push_back(r);
  }

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
  void evict(const LoweredProgram& lp);
  void begin_shutdown() { stopping_ = true; }

 private:
  std::shared_ptr<LoweredProgram> lowered(ProgramState& p);
  void pump_schedulers();
  void dispatch(RunRec& r);
  static bool urgent(const RunRec& r);
  void release_stage(RunRec& r, uint32_t s);
  void handle(Message& m);
  void finish_fetch(FetchRec& rec);
  // A released run of a disconnected client: not sent, its outputs failed, its record dropped.
  void abandon(RunRec& r);
  // Island ordering off: posts the runs staged in this pass, per worker grouped by client in
  // that worker's rotation of the clients.
  void post_staged();
  void write_trace();
  void predict();

  // Every worker reported the run: complete its outputs once its inputs are resolved (a run
  // may finish before the run that produced its input reported a failure).
  void complete_workers(RunRec& r);
  bool try_complete(uint64_t id);
  void retry_fetches();
  void check_deadlines();
  void flush_frees();

  Controller& c_;
  collectives::Transport& t_;
  Channel chan_;
  Backoff backoff_;
  std::vector<int> workers_;
  std::vector<std::unique_ptr<IslandScheduler>> scheds_;
  std::map<uint64_t, std::unique_ptr<RunRec>> runs_;
  std::map<uint64_t, double> exec_time_;  // lowered program id -> device time per worker (s)
  std::map<int, double> free_at_;          // world rank -> when its last completed run ended
  bool predictions_dirty_ = false;
  // predict(): per world rank, its first unfinished run's predicted completion (0: no estimate
  // yet), its program's mean time there and that over the program's kernels there (s).
  struct RankNext {
    double done, mean, kernel;
  };
  std::map<int, RankNext> rank_next_done_;
  std::deque<uint64_t> sent_order_;        // runs sent, in dispatch order (front: finished ones pruned)
  std::map<uint64_t, ObjMeta> objects_;
  std::map<int, std::vector<uint64_t>> frees_;
  struct FetchReq {
    std::shared_ptr<FetchRec> rec;
    size_t part;
    int rank;  // the worker asked
  };
  std::map<uint64_t, FetchReq> fetch_reqs_;
  std::vector<std::pair<std::shared_ptr<ArrayState>, std::shared_ptr<FutureState<HostTensor>>>> waiting_fetches_;
  std::map<uint64_t, std::pair<std::shared_ptr<FutureState<std::vector<WorkerStats>>>, std::vector<WorkerStats>>> stats_;
  std::map<int, uint64_t> caps_;                // world rank -> memory cap (0 = none)
  std::set<uint64_t> closed_;                   // disconnected clients
  std::map<uint64_t, ClientUsage> usage_;       // by client id
  std::map<uint64_t, std::vector<std::weak_ptr<ProgramState>>> programs_by_owner_;
  std::map<int, std::vector<std::pair<uint64_t, std::vector<uint8_t>>>> staged_;  // rank -> (client, kRun body)
  struct CtlSpan {
    uint64_t run_id, owner;
    std::string program;
    double t0, t1, predicted;
  };
  std::vector<CtlSpan> ctl_spans_;                                  // tracing: runs on the controller
  std::vector<std::pair<int, TraceRecord>> dev_spans_;              // tracing: kernels, by rank
  std::map<uint64_t, std::pair<std::string, std::vector<std::string>>> traced_runs_;  // run -> program, kernel per node
  std::vector<double> pred_scratch_;
  // The longest sleep taken to a predicted completion (see loop()): bounds how late a worker's
  // unexpected message (a failure) is noticed while the dispatcher expects nothing before then.
  static constexpr int64_t kMaxPredictedSleepUs = 50000;
  // Awaited runs are taken in batches of 1/batch_div_ of them (PWM_PW_BATCH_DIV; a large value
  // turns batching off).
  size_t batch_div_ = static_cast<size_t>(std::max(1.0, env_double("PWM_PW_BATCH_DIV", 2)));
  uint64_t next_req_ = 1, next_move_ = 0;
  size_t deferred_ = 0;  // runs whose workers are done but whose inputs are not resolved
  bool stopping_ = false, shutdown_sent_ = false, urgent_activity_ = false;
};

}  // namespace pwm::pathways
