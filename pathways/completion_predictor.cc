// Completion predictions (completion_predictor.h).
//
// The first version predicted from the noticed run time (dispatch to completion noticed), which
// includes the dispatcher's own lateness and fed it back; the workers' kernel times do not.
#include "pathways/completion_predictor.h"

#include <algorithm>

namespace pwm::pathways {

void CompletionPredictor::completed(const RunRec& r, double now) {
  dirty_ = true;
  if (!r.sent || r.lp->workers.empty()) return;
  const double n = static_cast<double>(r.lp->workers.size());
  const double d = r.kernel_s / n + 1e-6 * (1 + r.lp->execs / n);
  // Down at once, up slowly. A late prediction leaves the devices idle: an awaited run is slept
  // to its prediction, and the next run is dispatched only when this one is noticed. An early
  // one costs a few polls. A symmetric average kept the first steps (warm-up: 74 and 53 ms for
  // a 14 ms fused step) in the estimate for ten runs, and the dispatcher noticed each step up to
  // 50 ms late (docs/pathways_waiting.md, "Predictions fall at once").
  auto [it, fresh] = exec_time_.try_emplace(r.lp->id, d);
  if (!fresh) it->second = d < it->second ? d : 0.75 * it->second + 0.25 * d;
  // The completion was noticed at `now`; it happened no later, and likely near its prediction
  // when that was earlier: an early estimate only makes the dispatcher poll.
  const double done = r.predicted_done > 0 ? std::min(now, r.predicted_done) : now;
  for (auto& [rank, wp] : r.lp->workers) free_at_[rank] = std::max(free_at_[rank], done);
}

void CompletionPredictor::predict(RunTable& runs) {
  if (!dirty_) return;  // they depend on the runs sent and completed only
  dirty_ = false;
  std::map<int, double> free = free_at_;
  next_.clear();
  for (uint64_t id : runs.sent_order()) {
    RunRec* rp = runs.find(id);
    if (!rp || rp->workers_done) continue;
    RunRec& r = *rp;
    auto est = exec_time_.find(r.lp->id);
    const double mean = est == exec_time_.end() ? 0.0 : est->second;
    double start = r.dispatched;
    for (auto& [rank, wp] : r.lp->workers) start = std::max(start, free[rank]);
    const double done = est == exec_time_.end() ? 0 : start + mean;
    r.predicted_done = done;
    r.mean_s = mean;
    for (auto& [rank, wp] : r.lp->workers) {  // the first unfinished run of each rank
      if (!r.waiting.count(rank)) continue;   // this rank's share is done: its next run counts
      next_.try_emplace(rank, Next{done, mean, mean / static_cast<double>(std::max<size_t>(1, wp.execs.size()))});
    }
    for (auto& [rank, wp] : r.lp->workers)
      if (r.waiting.count(rank)) free[rank] = done > 0 ? done : std::max(free[rank], start);
  }
  runs.prune_sent();
}

}  // namespace pwm::pathways
