// Completion predictions: when each run on the devices will finish, and what each worker runs
// next, so that the dispatcher can sleep until then (sleep_planner.h) instead of polling.
//
// Inputs: each program's device time per worker (the kernel durations the workers report in
// run_done, averaged upwards but taken at once when shorter than the estimate, plus a few
// microseconds per instruction list entry), and when each worker last became free. The runs on the devices are taken in dispatch order, each starting
// when it was sent or when the previous run on its busiest worker is predicted to end, and
// lasting its program's device time. A run of a program never completed before has no
// prediction (0: the dispatcher polls finely for it if someone waits for it).
//
// Predictions are recomputed only when invalidated (a run sent or completed, or a worker's
// share reported while a fetch waits): recomputing them per dispatched run, or per idle poll,
// was quadratic in a burst of OpByOp calls. Dispatcher thread only.
#pragma once

#include <map>

#include "pathways/run_table.h"

namespace pwm::pathways {

class CompletionPredictor {
 public:
  // The first unfinished run of a worker.
  struct Next {
    double done;    // its predicted completion (0: no estimate)
    double mean;    // its program's mean time on the devices (s)
    double kernel;  // that over the program's kernels on this worker (s)
  };

  void invalidate() { dirty_ = true; }
  // Every worker reported `r` done at `now` (r.sent): updates its program's device time and
  // its workers' free times. Invalidates.
  void completed(const RunRec& r, double now);
  // Sets predicted_done and mean_s of every sent, unfinished run, and each worker's next run;
  // prunes the runs' sent order. Does nothing unless invalidated since the last call.
  void predict(RunTable& runs);
  // Worker `rank`'s first unfinished run, as of the last predict() (nullptr: none known).
  const Next* next_on(int rank) const {
    auto it = next_.find(rank);
    return it == next_.end() ? nullptr : &it->second;
  }

 private:
  std::map<uint64_t, double> exec_time_;  // lowered program id -> device time per worker (s)
  std::map<int, double> free_at_;         // world rank -> when its last completed run ended
  std::map<int, Next> next_;              // world rank -> its first unfinished run
  bool dirty_ = false;
};

}  // namespace pwm::pathways
