// The completion predictor (completion_predictor.h) against predictions worked out by hand:
// a program's device time from the workers' kernel times, runs queued behind each other on
// their workers, a worker's next run once it reported its share, and a program never seen.
#include <gtest/gtest.h>

#include "pathways/completion_predictor.h"

namespace pwm::pathways {
namespace {

std::shared_ptr<dataflow::LoweredProgram> program(uint64_t id, std::vector<int> ranks, int execs_per_rank) {
  auto lp = std::make_shared<dataflow::LoweredProgram>();
  lp->id = id;
  for (int r : ranks) lp->workers[r].execs.resize(static_cast<size_t>(execs_per_rank));
  lp->execs = static_cast<int>(ranks.size()) * execs_per_rank;
  return lp;
}

RunRec& send(RunTable& runs, uint64_t id, std::shared_ptr<dataflow::LoweredProgram> lp, double at) {
  auto r = std::make_unique<RunRec>();
  r->id = id;
  r->lp = std::move(lp);
  r->sent = true;
  r->dispatched = at;
  for (auto& [rank, wp] : r->lp->workers) r->waiting.insert(rank);
  RunRec& rr = runs.add(std::move(r));
  runs.sent(rr);
  return rr;
}

TEST(CompletionPredictor, QueuesRunsBehindEachOtherOnTheirWorkers) {
  RunTable runs;
  CompletionPredictor p;
  auto a = program(1, {1, 2}, 2);
  // A first run of program 1: no estimate yet.
  RunRec& r1 = send(runs, 11, a, 10.0);
  p.invalidate();
  p.predict(runs);
  EXPECT_EQ(r1.predicted_done, 0);
  // It completes, noticed at 10.2 s, its kernels having taken 0.1 s on each of its 2 workers:
  // 0.2 / 2 + 1 us * (1 + 4 execs / 2 workers) = 0.100003 s per run.
  r1.kernel_s = 0.2;
  r1.waiting.clear();
  r1.workers_done = true;
  p.completed(r1, 10.2);
  runs.remove(11);
  const double d = 0.1 + 3e-6;

  RunRec& r2 = send(runs, 12, a, 20.0);
  RunRec& r3 = send(runs, 13, a, 20.0);  // queued behind r2 on both workers
  p.predict(runs);
  EXPECT_DOUBLE_EQ(r2.predicted_done, 20.0 + d);
  EXPECT_DOUBLE_EQ(r3.predicted_done, 20.0 + 2 * d);
  EXPECT_DOUBLE_EQ(r2.mean_s, d);
  ASSERT_NE(p.next_on(1), nullptr);
  EXPECT_DOUBLE_EQ(p.next_on(1)->done, 20.0 + d);
  EXPECT_DOUBLE_EQ(p.next_on(1)->kernel, d / 2);  // 2 kernels on each worker
  EXPECT_EQ(p.next_on(3), nullptr);

  // Worker 1 reports its share of r2: its next run is r3; worker 2's is still r2.
  r2.waiting.erase(1);
  p.invalidate();
  p.predict(runs);
  EXPECT_DOUBLE_EQ(p.next_on(1)->done, 20.0 + 2 * d);
  EXPECT_DOUBLE_EQ(p.next_on(2)->done, 20.0 + d);

  // A program never completed: no prediction, and it does not delay what follows beyond its
  // own dispatch time.
  RunRec& r4 = send(runs, 14, program(2, {2}, 1), 30.0);
  RunRec& r5 = send(runs, 15, a, 30.0);
  p.invalidate();
  p.predict(runs);
  EXPECT_EQ(r4.predicted_done, 0);
  EXPECT_DOUBLE_EQ(r5.predicted_done, 30.0 + d);
}

// Warm-up runs (page faults, first touches) are far longer than the steady state: the estimate
// must drop to a shorter run at once (a late prediction idles the devices), and rise only by a
// quarter of the difference when a run is longer.
TEST(CompletionPredictor, DropsToAShorterRunAtOnceAndRisesSlowly) {
  RunTable runs;
  CompletionPredictor p;
  auto a = program(1, {1}, 1);
  const double over = 1e-6 * 2;  // 1 us * (1 + 1 exec / 1 worker)
  auto complete = [&](uint64_t id, double kernel_s) {
    RunRec& r = send(runs, id, a, 0.0);
    r.kernel_s = kernel_s;
    r.waiting.clear();
    r.workers_done = true;
    p.completed(r, 1.0);
    runs.remove(id);
  };
  auto mean = [&](uint64_t id) {
    RunRec& r = send(runs, id, a, 100.0);
    p.invalidate();
    p.predict(runs);
    const double m = r.mean_s;
    runs.remove(id);
    return m;
  };
  complete(1, 0.074);
  complete(2, 0.053);
  EXPECT_DOUBLE_EQ(mean(3), 0.053 + over);
  complete(4, 0.014);
  EXPECT_DOUBLE_EQ(mean(5), 0.014 + over);
  complete(6, 0.018);  // longer: a quarter of the way up
  EXPECT_DOUBLE_EQ(mean(7), 0.75 * (0.014 + over) + 0.25 * (0.018 + over));
}

TEST(CompletionPredictor, RecomputesOnlyWhenInvalidated) {
  RunTable runs;
  CompletionPredictor p;
  auto a = program(1, {1}, 1);
  RunRec& r1 = send(runs, 1, a, 1.0);
  r1.kernel_s = 0.5;
  r1.workers_done = true;
  p.completed(r1, 1.5);
  runs.remove(1);
  RunRec& r2 = send(runs, 2, a, 2.0);
  p.predict(runs);
  const double first = r2.predicted_done;
  EXPECT_GT(first, 2.5);
  r2.predicted_done = -1;  // not recomputed without invalidate()
  p.predict(runs);
  EXPECT_EQ(r2.predicted_done, -1);
  p.invalidate();
  p.predict(runs);
  EXPECT_EQ(r2.predicted_done, first);
}

}  // namespace
}  // namespace pwm::pathways
