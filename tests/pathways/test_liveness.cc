// Liveness (pathways/liveness.h): heartbeats are due once per quarter of the timeout, a peer is
// silent only after the timeout, a peer that left is not watched, and a stall of this process
// itself (a SIGSTOP, a long kernel) never makes its peers silent.
#include <gtest/gtest.h>

#include "pathways/liveness.h"

namespace pwm::pathways {

TEST(Liveness, HeartbeatsAreDueOncePerQuarterOfTheTimeout) {
  Liveness l(4.0, {1, 2}, 100.0);
  EXPECT_FALSE(l.due(100.5));
  EXPECT_TRUE(l.due(101.0));
  EXPECT_FALSE(l.due(101.5));
  EXPECT_TRUE(l.due(102.0));
}

TEST(Liveness, APeerIsSilentOnlyAfterTheTimeoutLongestSilenceFirst) {
  Liveness l(4.0, {1, 2, 3}, 100.0);
  for (double t = 100.5; t <= 105.5; t += 0.5) {
    l.due(t);
    l.heard(3, t);
    if (t <= 101.0) l.heard(2, t);
  }
  EXPECT_TRUE(l.silent(103.9).empty());
  EXPECT_EQ(l.silent(104.5), (std::vector<int>{1}));         // heard at 100.0
  EXPECT_EQ(l.silent(105.5), (std::vector<int>{1, 2}));      // 2 heard last at 101.0
  EXPECT_DOUBLE_EQ(l.silence(2, 105.5), 4.5);
  l.forget(1);
  EXPECT_EQ(l.silent(105.5), (std::vector<int>{2}));
  l.heard(1, 105.5);  // a peer that left stays unwatched
  EXPECT_EQ(l.silent(200.0).size(), 2u);
}

TEST(Liveness, AStallOfThisProcessDoesNotSilenceItsPeers) {
  Liveness l(4.0, {0}, 100.0);
  for (double t = 100.1; t < 102.0; t += 0.1) l.due(t);  // heard nothing since 100.0
  l.due(110.0);  // this process did not run for 8 s (stopped): the peer gets a fresh timeout
  EXPECT_TRUE(l.silent(110.0).empty());
  EXPECT_TRUE(l.silent(113.9).empty());
  for (double t = 110.1; t < 114.5; t += 0.1) l.due(t);
  EXPECT_EQ(l.silent(114.5), (std::vector<int>{0}));
}

}  // namespace pwm::pathways
