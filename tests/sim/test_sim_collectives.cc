// The simulator's collectives and links against cases computed by hand (docs/simulator.md,
// "Tests"): AllReduce and AllToAll on one link as the alpha-beta formulas and the cost model
// give them, segments, the cross-host link, a link's rate by message size.
#include <gtest/gtest.h>

#include "collectives/cost_model.h"
#include "common/check.h"
#include "sim/collective.h"
#include "tests/sim/sim_test_util.h"

namespace pwm::sim {
namespace {

using collectives::Algorithm;
using testing::kTol;
using testing::link;
using testing::zero_profile;
using testing::one_host;
using testing::range;

// Ring AllReduce of S bytes over n ranks, one segment per chunk, no reduction cost: 2(n-1)
// steps, each a chunk of S/n on the wire and one latency: 2(n-1)/n S/B + 2(n-1) L.
TEST(SimCollective, RingAllreduceMatchesAlphaBeta) {
  for (int n : {2, 3, 4, 5}) {
    const double B = 1.0, L = 10.0;  // GB/s, us
    const size_t S = static_cast<size_t>(n) * 4 * 60000;  // divisible by n, float elements
    const Profile p = zero_profile();
    const Cluster c = one_host(n, link(L, B, 0));
    const auto r = simulate_allreduce(c, p, range(n), S, Algorithm::kRing, {}, /*segment_bytes=*/S);
    const double want = 2.0 * (n - 1) / n * static_cast<double>(S) / (B * 1e3) + 2.0 * (n - 1) * L;
    EXPECT_NEAR(r.end, want, kTol) << "n=" << n;
    EXPECT_EQ(r.messages, static_cast<size_t>(n) * 2 * (n - 1));
  }
}

// Segments: with s segments per chunk and a port slower than a segment's round (s x wire >=
// wire + L), every step's sends stream back to back on each rank's port: 2(n-1) steps of s
// segment wires, then the last segment's latency.
TEST(SimCollective, SegmentedRingIsPortBound) {
  const int n = 4, segs = 8;
  const double B = 2.0, L = 5.0;
  const size_t S = 4u * n * segs * 1000;
  const Profile p = zero_profile();
  const Cluster c = one_host(n, link(L, B, 0));
  const auto r = simulate_allreduce(c, p, range(n), S, Algorithm::kRing, {}, S / n / segs);
  const double seg_us = static_cast<double>(S) / n / segs / (B * 1e3);
  ASSERT_GE(segs * seg_us, seg_us + L);  // the regime the formula is for
  EXPECT_NEAR(r.end, 2.0 * (n - 1) * segs * seg_us + L, kTol);
}

// Halving-doubling on p = 4: messages of S/2, S/4 then S/4, S/2: 1.5 S/B + 4 L.
TEST(SimCollective, HalvingDoublingMatchesAlphaBeta) {
  const double B = 1.0, L = 7.0;
  const size_t S = 4 * 100000;
  const Profile p = zero_profile();
  const Cluster c = one_host(4, link(L, B, 0));
  const auto r = simulate_allreduce(c, p, range(4), S, Algorithm::kHalvingDoubling);
  EXPECT_NEAR(r.end, 1.5 * static_cast<double>(S) / (B * 1e3) + 4 * L, kTol);
}

// AllToAll of m bytes per peer on one link (latency L, bandwidth B, no copy cost): pairwise's
// n-1 exchanges of m take (n-1)(L + m/B); Bruck's log2 n steps of b_k blocks, each waiting for a
// block the previous step brought, take sum_k (L + b_k m/B). Both are the cost model's
// alltoall_us with alpha = L, beta = 1/B and no copy cost.
TEST(SimCollective, AlltoallMatchesTheCostModel) {
  const double B = 2.0, L = 6.0;
  const size_t m = 4 * 30000;
  const Profile p = zero_profile();
  collectives::CostModel cm;
  cm.alpha_us = L, cm.beta_ns_per_byte = 1.0 / B, cm.gamma_ns_per_byte = 0;
  for (int n : {2, 3, 4, 5}) {
    const Cluster c = one_host(n, link(L, B, 0));
    const auto r = simulate_alltoall(c, p, range(n), m, Algorithm::kPairwise);
    EXPECT_NEAR(r.end, (n - 1) * (L + static_cast<double>(m) / (B * 1e3)), kTol) << "n=" << n;
    EXPECT_NEAR(r.end, cm.alltoall_us(Algorithm::kPairwise, m, n), kTol) << "n=" << n;
    EXPECT_EQ(r.messages, static_cast<size_t>(n * (n - 1)));
    EXPECT_NEAR(simulate_alltoall(c, p, range(n), m, Algorithm::kMpi).end, r.end, kTol);  // modelled as pairwise
  }
  for (int n : {2, 4, 8}) {
    const Cluster c = one_host(n, link(L, B, 0));
    const auto r = simulate_alltoall(c, p, range(n), m, Algorithm::kBruck);
    int steps = 0;
    while ((1 << steps) < n) ++steps;
    EXPECT_NEAR(r.end, steps * (L + n / 2 * static_cast<double>(m) / (B * 1e3)), kTol) << "n=" << n;
    EXPECT_NEAR(r.end, cm.alltoall_us(Algorithm::kBruck, m, n), kTol) << "n=" << n;
    EXPECT_EQ(r.messages, static_cast<size_t>(n * steps));
  }
  const Cluster c = one_host(2, link(L, B, 0));
  EXPECT_THROW(simulate_alltoall(c, p, range(2), m, Algorithm::kRing), pwm::Error);
  EXPECT_EQ(simulate_alltoall(one_host(1, link(L, B, 0)), p, range(1), m).end, 0.0);
}

// Two ranks: on one host the in-host link, on two hosts the cross-host link: 2 (S/2/B + L) each.
TEST(SimCollective, CrossHostUsesTheInterLink) {
  const size_t S = 4 * 40000;
  const Profile p = zero_profile();
  Cluster c;
  c.devices_per_host = 1;
  c.hosts = 2;
  c.intra = link(1, 100, 0);
  c.inter = link(20, 0.5, 3);
  const auto r = simulate_allreduce(c, p, range(2), S, Algorithm::kRing, {}, S);
  EXPECT_NEAR(r.end, 2 * (3 + static_cast<double>(S) / 2 / 0.5e3 + 20), kTol);
  c.devices_per_host = 2;
  c.hosts = 1;
  const auto q = simulate_allreduce(c, p, range(2), S, Algorithm::kRing, {}, S);
  EXPECT_NEAR(q.end, 2 * (static_cast<double>(S) / 2 / 100e3 + 1), kTol);
}

// A link with a measured rate per message size: at a measured size exactly that rate, between
// two sizes the rate interpolated in log(bytes) (halfway in log: the mean rate), outside the
// nearest; a 2-rank ring AllReduce of S bytes sends two messages of S/2 at the rate of S/2.
TEST(SimLink, RateBySizeInterpolatesInLogBytes) {
  Link l = link(10, 1.0, 0);
  l.gbytes_per_s_by_bytes = {{1000, 0.02}, {100000, 0.01}};
  EXPECT_NEAR(l.wire_us(1000), 1000 / 20.0, kTol);
  EXPECT_NEAR(l.wire_us(100000), 100000 / 10.0, kTol);
  EXPECT_NEAR(l.wire_us(10000), 10000 / 15.0, kTol);    // log-midpoint: (20 + 10) / 2 bytes/us
  EXPECT_NEAR(l.wire_us(10), 10 / 20.0, kTol);          // below the first size: its rate
  EXPECT_NEAR(l.wire_us(1e7), 1e7 / 10.0, kTol);        // above the last: its rate
  const Profile p = zero_profile();
  Cluster c;
  c.devices_per_host = 1;
  c.hosts = 2;
  c.inter = l;
  const size_t S = 20000;  // messages of 10000 bytes: 15 bytes/us
  const auto r = simulate_allreduce(c, p, range(2), S, Algorithm::kRing, {}, S);
  EXPECT_NEAR(r.end, 2 * (10000 / 15.0 + 10), kTol);
}

}  // namespace
}  // namespace pwm::sim
