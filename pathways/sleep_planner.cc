// The dispatcher's sleep rules (sleep_planner.h). Each wake-up of the controller takes a core
// from a worker on a shared machine, and a worker preempted for x us delays its peers x us at
// their next in-kernel AllReduce: the rules wake the dispatcher as rarely as the clients waiting
// on it allow.
#include "pathways/sleep_planner.h"

#include <algorithm>
#include <cstdint>

namespace pwm::pathways {

namespace {
// A predicted wake-up is taken this much early: the condition variable's wake-up is late by
// about that much.
constexpr double kWakeEarlyUs = 10;
}  // namespace

SleepPlan plan_sleep(const SleepInputs& in, double now, const LatencyPolicy& p, std::vector<double>& pred) {
  SleepPlan plan;
  plan.poll_cap_us = p.backoff_max_us;
  plan.held = in.held;
  pred.clear();
  // The shortest mean of an overdue run or of the run an overdue fetch waits behind (-1: none).
  double overdue_mean_s = -1;
  auto overdue = [&](double mean) { overdue_mean_s = overdue_mean_s < 0 ? mean : std::min(overdue_mean_s, mean); };
  for (const AwaitedRun& r : in.awaited) {
    if (r.predicted_done <= now) {  // overdue, or no estimate yet
      pred.push_back(now);
      overdue(r.mean_s);
    } else {
      pred.push_back(r.predicted_done);
    }
  }
  for (const PendingFetch& f : in.fetches) {
    if (!f.known || f.next_done <= now) {
      pred.push_back(now);
      if (f.known) overdue(f.mean_s);
    } else {
      pred.push_back(std::min(f.next_done, now + std::max(f.kernel_s, 1e-6 * p.busy_backoff_max_us)));
    }
  }
  if (!pred.empty()) {
    const size_t div = static_cast<size_t>(std::max(1.0, p.batch_div));
    const size_t m = std::max<size_t>(1, pred.size() / div);
    std::nth_element(pred.begin(), pred.begin() + static_cast<std::ptrdiff_t>(m - 1), pred.end());
    double t_m = pred[m - 1];
    const double dry = in.busy_until - 1e-6 * p.reserve_us;  // the latest wake-up that leaves a reserve
    if (in.busy_until > 0) t_m = std::min(t_m, dry);
    const bool run_dry_soon = dry <= now;  // then poll finely
    const double overdue_cap_us = run_dry_soon ? 0 : 1e6 * p.overdue_poll_fraction * std::max(0.0, overdue_mean_s);
    if (t_m <= now)
      plan.poll_cap_us = std::min(plan.poll_cap_us, std::max(p.busy_backoff_max_us, overdue_cap_us));
    else
      plan.wake_at = t_m;
  }
  if (in.held) plan.poll_cap_us = std::min(plan.poll_cap_us, p.busy_backoff_max_us);
  return plan;
}

SleepPlan::Wait SleepPlan::wait(std::chrono::microseconds backoff, double now, const LatencyPolicy& p) const {
  Wait w{backoff, false};
  if (wake_at <= 0) return w;
  auto until = std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, (wake_at - now) * 1e6 - kWakeEarlyUs)));
  // Without runs held back, a far prediction (a 700 ms training step) is slept to in one go:
  // waking every millisecond to find nothing preempts a worker each time.
  if (!held) until = std::min(until, std::chrono::microseconds(static_cast<int64_t>(p.max_predicted_sleep_us)));
  if (until < w.duration || !held) {
    w.duration = until;
    w.predicted = true;
  }
  return w;
}

}  // namespace pwm::pathways
