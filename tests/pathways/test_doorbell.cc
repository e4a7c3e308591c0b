// The dispatcher's doorbell (doorbell.h): what it accepts and when, and that a pending command
// or poke never lets the dispatcher fall asleep (the deterministic half of its contract; the
// wake-up rules under load are exercised by every runtime test).
#include <gtest/gtest.h>

#include <chrono>

#include "common/time.h"
#include "pathways/doorbell.h"

namespace pwm::pathways {
namespace {

using std::chrono::microseconds;
using std::chrono::seconds;

TEST(Doorbell, AcceptsOnlyWhileOpen) {
  Doorbell bell{LatencyPolicy{}};
  std::vector<Doorbell::Command> got;
  EXPECT_FALSE(bell.push([](Dispatcher&) {}));  // before open()
  bell.open();
  EXPECT_TRUE(bell.push([](Dispatcher&) {}));
  EXPECT_TRUE(bell.push([](Dispatcher&) {}, /*wake=*/true));
  bell.take(got);
  EXPECT_EQ(got.size(), 2u);
  got.clear();
  bell.take(got);
  EXPECT_TRUE(got.empty());
  bell.close([](Dispatcher&) {});  // the final command
  EXPECT_FALSE(bell.push([](Dispatcher&) {}));
  bell.take(got);
  EXPECT_EQ(got.size(), 1u);
  got.clear();
  bell.close([](Dispatcher&) {});  // closing twice queues nothing more
  bell.take(got);
  EXPECT_TRUE(got.empty());
}

TEST(Doorbell, PendingWorkIsNeverSleptOn) {
  Doorbell bell{LatencyPolicy{}};
  bell.open();
  ASSERT_TRUE(bell.push([](Dispatcher&) {}));
  double t0 = now_s();
  bell.sleep(seconds(10), t0, 0);  // a command is queued: returns at once
  EXPECT_LT(now_s() - t0, 5.0);
  std::vector<Doorbell::Command> got;
  bell.take(got);

  bell.poke();  // a client started waiting: the next sleep is re-planned, not taken
  t0 = now_s();
  bell.sleep(seconds(10), t0, t0 + 100);
  EXPECT_LT(now_s() - t0, 5.0);

  t0 = now_s();  // the poke was consumed: this sleep is taken
  bell.sleep(microseconds(2000), t0, 0);
  EXPECT_GE(now_s() - t0, 1.9e-3);
}

}  // namespace
}  // namespace pwm::pathways
