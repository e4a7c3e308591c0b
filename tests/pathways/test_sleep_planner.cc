// The dispatcher's sleep planner (sleep_planner.h), table-driven: each row is a situation the
// dispatcher meets (a long fused step, a burst of OpByOp calls, several clients, fetches, a
// scheduler holding runs) with the poll cap, wake-up and sleep worked out by hand from the rules
// in the header, with the default LatencyPolicy (backoff_max 1000 us, busy_backoff_max 200 us,
// reserve 250 us, batch_div 2, max_predicted_sleep 50 ms, overdue poll 1% of the mean).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pathways/sleep_planner.h"

namespace pwm::pathways {
namespace {

constexpr double kNow = 1000.0;  // now_s(): seconds since the clock's epoch, as in the dispatcher
constexpr double us = 1e-6;

struct Row {
  std::string name;
  std::vector<AwaitedRun> awaited;
  std::vector<PendingFetch> fetches;
  double busy_until;    // absolute, 0: nothing on the devices
  bool held;
  double batch_div;
  double backoff_us;    // the back-off's next wait (after its cap)
  // expected:
  double cap_us;
  double wake_in_us;    // wake_at - now (0: no predicted wake-up)
  double sleep_us;      // the wait taken
  bool predicted;
};

std::vector<Row> rows() {
  const double step = 0.7;  // a fused training step
  return {
      {"idle: nothing awaited", {}, {}, 0, false, 2, 1000, 1000, 0, 1000, false},
      {"runs nobody waits for keep the idle back-off", {}, {}, kNow + step, false, 2, 1000, 1000, 0, 1000, false},
      // Woken 250 us before the devices run dry, but a sleep is at most 50 ms at a time.
      {"long fused step, awaited", {{kNow + step, step}}, {}, kNow + step, false, 2, 10, 1000, step * 1e6 - 250, 50000, true},
      {"long fused step, predicted soon", {{kNow + 2e-3, step}}, {}, kNow + 2e-3, false, 2, 10, 1000, 1750, 1740, true},
      // Overdue and nothing else queued: the devices are about to run dry, poll finely.
      {"long fused step, overdue", {{kNow - 0.05, step}}, {}, kNow - 0.05, false, 2, 200, 200, 0, 200, false},
      // Two steps in flight, the first overdue: 1% of 700 ms is 7 ms, capped by the idle 1 ms.
      {"two fused steps in flight, the first overdue", {{kNow - 0.05, step}, {kNow + step, step}}, {}, kNow + step, false, 2, 1000,
       1000, 0, 1000, false},
      {"a burst of OpByOp calls without estimates", std::vector<AwaitedRun>(8), {}, 0, false, 2, 40, 200, 0, 40, false},
      {"a burst of OpByOp calls, predicted", {{kNow + 30 * us, 30 * us}, {kNow + 60 * us, 30 * us}, {kNow + 90 * us, 30 * us}}, {},
       kNow + 90 * us, false, 2, 10, 200, 0, 10, false},
      // Four clients each waiting for one run: wake when half are done (200 us), but no later
      // than 250 us before the last is (150 us).
      {"several clients, batched",
       {{kNow + 100 * us, 1e-4}, {kNow + 200 * us, 1e-4}, {kNow + 300 * us, 1e-4}, {kNow + 400 * us, 1e-4}}, {}, kNow + 400 * us, false,
       2, 10, 1000, 150, 140, true},
      {"several clients, long runs, batched",
       {{kNow + 1e-3, 1e-3}, {kNow + 2e-3, 1e-3}, {kNow + 3e-3, 1e-3}, {kNow + 4e-3, 1e-3}}, {}, kNow + 4e-3, false, 2, 10, 1000,
       2000, 1990, true},
      {"several clients, batching off (the first)",
       {{kNow + 1e-3, 1e-3}, {kNow + 2e-3, 1e-3}, {kNow + 3e-3, 1e-3}, {kNow + 4e-3, 1e-3}}, {}, kNow + 4e-3, false, 100, 10, 1000,
       1000, 990, true},
      // A fetch behind a 700 ms step of 20 kernels: answered after one kernel (35 ms).
      {"a fetch behind a long step", {}, {{true, kNow + step, step, step / 20}}, kNow + step, false, 2, 10, 1000, 35000, 34990, true},
      // ... behind many tiny kernels: not sooner than the fine polling interval.
      {"a fetch behind tiny kernels", {}, {{true, kNow + 0.01, 0.01, 1e-6}}, kNow + 0.01, false, 2, 10, 1000, 200, 190, true},
      {"a fetch on an idle worker", {}, {PendingFetch{}}, 0, false, 2, 40, 200, 0, 40, false},
      // Overdue fetch with work still queued: the 1% rule (7 ms) is capped by the idle 1 ms.
      {"a fetch behind an overdue step", {}, {{true, kNow - 0.01, step, step / 20}}, kNow + step, false, 2, 1000, 1000, 0, 1000, false},
      // A scheduler holds runs: poll every 200 us, and a far prediction does not lengthen that.
      {"held runs, far prediction", {{kNow + step, step}}, {}, kNow + step, true, 2, 200, 200, step * 1e6 - 250, 200, false},
      {"held runs, near prediction", {{kNow + 100 * us, 1e-4}}, {}, kNow + 1e-3, true, 2, 200, 200, 100, 90, true},
  };
}

TEST(SleepPlanner, Table) {
  std::vector<double> scratch;
  for (const Row& r : rows()) {
    SCOPED_TRACE(r.name);
    LatencyPolicy p;
    p.batch_div = r.batch_div;
    const SleepPlan plan = plan_sleep({r.awaited, r.fetches, r.busy_until, r.held}, kNow, p, scratch);
    EXPECT_DOUBLE_EQ(plan.poll_cap_us, r.cap_us);
    if (r.wake_in_us == 0)
      EXPECT_EQ(plan.wake_at, 0);
    else
      EXPECT_NEAR((plan.wake_at - kNow) * 1e6, r.wake_in_us, 0.01);
    const SleepPlan::Wait w = plan.wait(std::chrono::microseconds(static_cast<int64_t>(r.backoff_us)), kNow, p);
    EXPECT_NEAR(static_cast<double>(w.duration.count()), r.sleep_us, 1.0);  // (truncated to whole microseconds)
    EXPECT_EQ(w.predicted, r.predicted);
  }
}

// The planner reads only its inputs: the same inputs give the same plan, whatever the scratch
// held before.
TEST(SleepPlanner, ScratchContentsDoNotMatter) {
  const std::vector<AwaitedRun> runs{{kNow + 1e-3, 1e-3}, {kNow + 2e-3, 1e-3}};
  std::vector<double> a, b{1, 2, 3, -4, kNow + 1e-6};
  const SleepPlan pa = plan_sleep({runs, {}, kNow + 2e-3, false}, kNow, LatencyPolicy{}, a);
  const SleepPlan pb = plan_sleep({runs, {}, kNow + 2e-3, false}, kNow, LatencyPolicy{}, b);
  EXPECT_EQ(pa.wake_at, pb.wake_at);
  EXPECT_EQ(pa.poll_cap_us, pb.poll_cap_us);
}

}  // namespace
}  // namespace pwm::pathways
