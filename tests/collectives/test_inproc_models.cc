// What the collectives compute beside the data: the cost model's choice of algorithm and its
// estimates, recursive_doubling_sum against the AllReduce it stands for (ranks as threads), the
// clock sync's offset estimate.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "collectives/clock_sync.h"
#include "collectives/communicator.h"
#include "collectives/inproc_transport.h"

namespace pwm::collectives {
namespace {

TEST(CostModel, AlltoallPicksBruckForSmallBlocksOnLargerGroups) {
  CostModel m;
  for (int p : {2, 3}) EXPECT_EQ(m.pick_alltoall(8, p), Algorithm::kPairwise) << p;  // Bruck saves no message
  EXPECT_EQ(m.pick_alltoall(8, 8), Algorithm::kBruck);
  EXPECT_EQ(m.pick_alltoall(1 << 20, 8), Algorithm::kPairwise);
  EXPECT_EQ(m.pick_alltoall(8, 8, /*equal_counts=*/false), Algorithm::kPairwise);
  // pairwise: (p-1)(alpha + m beta); Bruck on 4: 2 steps of 2 blocks, 4 packed + 4 rotated copies.
  const double m4 = 1000, beta = m.beta_ns_per_byte * 1e-3, copy = 0.5 * m.gamma_ns_per_byte * 1e-3;
  EXPECT_DOUBLE_EQ(m.alltoall_us(Algorithm::kPairwise, 1000, 4), 3 * (m.alpha_us + m4 * beta));
  EXPECT_DOUBLE_EQ(m.alltoall_us(Algorithm::kBruck, 1000, 4), 2 * (m.alpha_us + 2 * m4 * beta) + 8 * m4 * copy);
}

TEST(RecursiveDoubling, SumComputedAloneEqualsTheCollective) {
  // Summands whose sum depends on the grouping (1e16 + 1 - 1e16 ...): recursive_doubling_sum
  // must give the AllReduce's bits on every group size, power of two or not.
  for (int n = 1; n <= 7; ++n) {
    std::vector<double> v;
    for (int r = 0; r < n; ++r) v.push_back((r % 2 == 0 ? 1e16 : -1e16) * (1 + r / 2) + 0.37 * r);
    std::mutex mu;
    std::vector<double> got;
    run_inproc(n, [&](int rank, std::shared_ptr<Transport> t) {
      Communicator c = Communicator::world(t, CommOptions{});
      double x = v[static_cast<size_t>(rank)];
      c.allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(x);
    });
    for (double g : got) EXPECT_EQ(g, recursive_doubling_sum(v)) << "n = " << n;
  }
}

TEST(CostModel, PicksLatencyAlgorithmsForSmallAndBandwidthForLarge) {
  CostModel m;
  EXPECT_EQ(m.pick_allreduce(4, 2, 256 << 10), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(m.pick_allreduce(4, 8, 256 << 10), Algorithm::kRecursiveDoubling);
  Algorithm big = m.pick_allreduce(64 << 20, 8, 256 << 10);
  EXPECT_TRUE(big == Algorithm::kRing || big == Algorithm::kHalvingDoubling);
  // Ring's bandwidth term equals halving-doubling's; its latency term is larger.
  EXPECT_GT(m.allreduce_us(Algorithm::kRing, 1024, 8, 1 << 20),
            m.allreduce_us(Algorithm::kHalvingDoubling, 1024, 8, 1 << 20));
}

TEST(ClockSync, TheLeastDelayedSampleGivesTheOffsetWithinHalfItsRoundTrip) {
  // A peer clock 5,000,000 us ahead of rank 0's; legs of unequal length (queueing on the way
  // back in the slow samples). The estimate uses the 20 us round trip: error <= 10 us.
  const int64_t skew = 5'000'000;
  auto sample = [&](int64_t t0, int64_t there, int64_t back) {
    return ClockSample{t0, t0 + there + skew, t0 + there + back};
  };
  std::vector<ClockSample> s = {sample(100, 300, 900), sample(2000, 12, 8), sample(5000, 40, 400)};
  const ClockOffset o = estimate_clock_offset(s);
  EXPECT_EQ(o.error_us, 10);
  EXPECT_LE(std::abs(o.offset_us - skew), o.error_us);
  EXPECT_EQ(o.offset_us, skew + 2);  // the peer read its clock 12 us in, the midpoint is 10 us in
  // A clock behind rank 0's, symmetric legs: exact.
  std::vector<ClockSample> behind = {{1000, 1000 + 25 - 777, 1050}};
  EXPECT_EQ(estimate_clock_offset(behind).offset_us, -777);
  EXPECT_THROW(estimate_clock_offset({}), pwm::Error);
}

}  // namespace
}  // namespace pwm::collectives
