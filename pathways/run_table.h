// The dispatcher's run table: every run from its submission until its outputs are complete
// (or failed), and the order in which runs were sent to the devices.
//
// A run is entered when the dispatcher accepts it (inputs checked, program lowered), is sent
// when the last island scheduler it touches releases it, collects the workers' run_done
// answers, and leaves the table when its outputs are completed (try_complete in dispatcher.cc)
// or when a disconnected client's held run is abandoned. Dispatcher thread only.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pathways/controller.h"

namespace pwm::pathways {

struct RunRec {
  uint64_t id = 0;
  std::shared_ptr<ProgramState> prog;
  std::shared_ptr<dataflow::LoweredProgram> lp;
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
  // From the completion predictor (completion_predictor.h), for sent runs: predicted
  // completion on the devices (0: unknown) and the program's mean device time (0: unknown).
  double predicted_done = 0, mean_s = 0;
  uint32_t stage = 0;          // sequential: the stage released last
  std::set<int> stage_waiting;
  std::map<std::pair<int, uint32_t>, double> running;  // (rank, node) -> start time (deadline runs)
  std::set<std::pair<int, uint32_t>> finished;

  // Someone waits for it: a client waits for (or fetches) an output, it is sequential (its
  // stages go through the dispatcher) or it has a deadline. Awaited runs are polled finely.
  bool awaited() const;
  // The deadline failure: which device is stuck in which node, or waits for what.
  std::string missed_deadline(double now) const;
};

class RunTable {
 public:
  using Map = std::map<uint64_t, std::unique_ptr<RunRec>>;

  RunRec& add(std::unique_ptr<RunRec> r);
  RunRec* find(uint64_t id) {
    auto it = runs_.find(id);
    return it == runs_.end() ? nullptr : it->second.get();
  }
  // Removes the run and returns it (its destruction drops its handles, which may queue frees).
  std::unique_ptr<RunRec> remove(uint64_t id);
  bool empty() const { return runs_.empty(); }
  Map::iterator begin() { return runs_.begin(); }
  Map::iterator end() { return runs_.end(); }

  // The run was sent to its workers (dispatch order, for the completion predictions).
  void sent(const RunRec& r) { sent_order_.push_back(r.id); }
  // Runs sent and not finished when last pruned, in dispatch order (finished ones may remain).
  const std::deque<uint64_t>& sent_order() const { return sent_order_; }
  // Forgets the finished runs at the front of sent_order().
  void prune_sent();

  size_t deferred = 0;  // runs whose workers are done but whose inputs are not resolved

 private:
  Map runs_;
  std::deque<uint64_t> sent_order_;
};

}  // namespace pwm::pathways
