// The collectives over the in-process transport (ranks as threads): the whole conformance
// matrix at group sizes 1..5, plus the watchdog, the fingerprint check and sub-groups.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <thread>

#include "collectives/bucketed_allreduce.h"
#include "collectives/clock_sync.h"
#include "collectives/communicator.h"
#include "collectives/inproc_transport.h"
#include "tests/collectives/conformance.h"

namespace pwm::collectives {
namespace {

using testing::ConformanceOptions;

// Runs fn on n threads and collects the failures every rank reports.
std::vector<std::string> on_ranks(int n, CommOptions opts,
                                  const std::function<std::vector<std::string>(Communicator&)>& fn) {
  std::mutex mu;
  std::vector<std::string> all;
  run_inproc(n, [&](int, std::shared_ptr<Transport> t) {
    Communicator comm = Communicator::world(t, opts);
    auto f = fn(comm);
    std::lock_guard<std::mutex> lock(mu);
    all.insert(all.end(), f.begin(), f.end());
  });
  return all;
}

CommOptions default_options() {
  CommOptions o;
  o.timeout_s = 60;
  return o;
}

class InProcSizes : public ::testing::TestWithParam<int> {};

TEST_P(InProcSizes, AllReduceMatchesAnalytic) {
  auto fails = on_ranks(GetParam(), default_options(),
                        [](Communicator& c) { return testing::check_allreduce(c, ConformanceOptions{}); });
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << fails.front();
}

TEST_P(InProcSizes, AllReduceWithTinySegmentsPipelines) {
  CommOptions o = default_options();
  o.segment_bytes = 64;  // many segments per chunk: exercises per-segment dependencies
  ConformanceOptions co;
  co.counts = {0, 1, 7, 131, 5003};
  auto fails = on_ranks(GetParam(), o, [&](Communicator& c) { return testing::check_allreduce(c, co); });
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << fails.front();
}

TEST_P(InProcSizes, OtherCollectivesMatchAnalytic) {
  CommOptions o = default_options();
  o.segment_bytes = 4096;
  ConformanceOptions co;
  co.counts = {0, 1, 7, 131, 70001};  // 70001 x 4..8 bytes x 8 ranks: several MiB gathered
  auto fails = on_ranks(GetParam(), o, [&](Communicator& c) {
    return testing::check_other_collectives(c, co);
  });
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << fails.front();
}

TEST_P(InProcSizes, NonBlockingOverlap) {
  auto fails = on_ranks(GetParam(), default_options(), [](Communicator& c) { return testing::check_nonblocking(c); });
  EXPECT_TRUE(fails.empty()) << fails.front();
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, InProcSizes, ::testing::Values(1, 2, 3, 4, 5, 8));

class InProcAlltoall : public ::testing::TestWithParam<int> {};

TEST_P(InProcAlltoall, MatchesReference) {
  auto fails = on_ranks(GetParam(), default_options(),
                        [](Communicator& c) { return testing::check_alltoall(c, ConformanceOptions{}); });
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << fails.front();
}

TEST_P(InProcAlltoall, NonBlockingOverlapsAnAllreduce) {
  auto fails = on_ranks(GetParam(), default_options(),
                        [](Communicator& c) { return testing::check_alltoall_nonblocking(c); });
  EXPECT_TRUE(fails.empty()) << fails.front();
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, InProcAlltoall, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

TEST(InProcAlltoall, FingerprintsPassOnValidCalls) {
  // Debug mode on every AllToAll of the matrix: alltoallv's per-pair counts agree, no false alarm.
  CommOptions o = default_options();
  o.fingerprint = true;
  ConformanceOptions co;
  co.alltoall_counts = {0, 5};
  auto fails = on_ranks(3, o, [&](Communicator& c) { return testing::check_alltoall(c, co); });
  EXPECT_TRUE(fails.empty()) << fails.front();
}

TEST(InProcAlltoall, FingerprintNamesAPairThatDisagrees) {
  // Rank 0 sends 3 elements to rank 1, which expects 5; rank 1 sends 4 to rank 0, which expects 6.
  CommOptions o;
  o.timeout_s = 5;
  o.fingerprint = true;
  std::mutex mu;
  std::vector<std::string> errors;
  run_inproc(2, [&](int rank, std::shared_ptr<Transport> t) {
    Communicator c = Communicator::world(t, o);
    std::vector<float> x(16, 1.f), y(16);
    const std::vector<size_t> sc = rank == 0 ? std::vector<size_t>{2, 3} : std::vector<size_t>{4, 2};
    const std::vector<size_t> rc = rank == 0 ? std::vector<size_t>{2, 6} : std::vector<size_t>{5, 2};
    try {
      c.alltoallv(x.data(), sc, y.data(), rc, DataType::kFloat32, Algorithm::kPairwise);
    } catch (const pwm::Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("collective mismatch (PWM_COLL_DEBUG)"), std::string::npos) << e;
    EXPECT_NE(e.find("alltoallv(pairwise"), std::string::npos) << e;
    EXPECT_NE(e.find("an alltoallv's count is the pair's"), std::string::npos) << e;
  }
}

TEST(InProcAlltoall, BadArgumentsAreOneLine) {
  InProcFabric f(2);
  Communicator c(f.transport(0), {0, 1}, 0, default_options());
  float x[4] = {}, y[4] = {};
  const std::vector<size_t> one = {1}, two = {1, 1}, mine_differs = {2, 1};
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const pwm::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { c.ialltoallv(x, one, y, two, DataType::kFloat32); }),
            "alltoallv: send_counts has 1 entries and recv_counts 2, for a group of 2 (one per member)");
  EXPECT_EQ(message([&] { c.ialltoallv(x, mine_differs, y, two, DataType::kFloat32); }),
            "alltoallv: group rank 0 sends 2 elements to itself but receives 1 from itself");
  EXPECT_EQ(message([&] { c.ialltoallv(x, two, y, two, DataType::kFloat32, Algorithm::kBruck); }),
            "alltoallv does not take algorithm 'bruck': use auto, pairwise, linear or mpi (bruck needs equal counts: "
            "alltoall)");
  EXPECT_EQ(message([&] { c.ialltoall(x, y, 1, DataType::kFloat32, Algorithm::kRing); }),
            "alltoall does not take algorithm 'ring': use auto, pairwise, bruck, linear or mpi");
  EXPECT_EQ(message([&] { c.iallreduce(x, y, 1, DataType::kFloat32, ReduceOp::kSum, Algorithm::kPairwise); }),
            "allreduce does not take algorithm 'pairwise': use auto, ring, hd, rd or mpi");
  EXPECT_EQ(message([&] { c.alltoall_counts(one); }),
            "alltoall_counts: send_counts has 1 entries for a group of 2 (one per member)");
  EXPECT_EQ(message([&] { c.ialltoall(x, y, 1, DataType::kFloat32, Algorithm::kMpi); }),
            "algorithm 'mpi' needs the MPI transport (this transport is 'inproc')");
  EXPECT_EQ(message([&] { parse_algorithm("bruk"); }),
            "unknown algorithm 'bruk': use auto, ring, hd (halving-doubling), rd (recursive doubling), mpi, or for "
            "alltoall pairwise, bruck, linear");
}

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

TEST(InProcWatchdog, NamesTheMissingRankAndFires) {
  CommOptions o;
  o.timeout_s = 0.5;
  std::string report;
  std::mutex mu;
  EXPECT_THROW(
      run_inproc(3,
                 [&](int rank, std::shared_ptr<Transport> t) {
                   Communicator c = Communicator::world(t, o);
                   if (rank == 2) return;  // rank 2 never calls the collective
                   std::vector<float> x(100, 1.f);
                   try {
                     c.allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum,
                                 Algorithm::kRing);
                   } catch (const CollectiveTimeout& e) {
                     std::lock_guard<std::mutex> lock(mu);
                     if (rank == 0) report = e.what();
                     throw;
                   }
                 }),
      CollectiveTimeout);
  // In the ring rank 0 receives from rank 2, which never posts its part: rank 0 names it.
  EXPECT_NE(report.find("collective watchdog"), std::string::npos) << report;
  EXPECT_NE(report.find("allreduce(ring, float32, sum, count=100"), std::string::npos) << report;
  EXPECT_NE(report.find("world rank(s) 2"), std::string::npos) << report;
}

TEST(InProcFingerprint, CountMismatchIsNamed) {
  CommOptions o;
  o.timeout_s = 5;
  o.fingerprint = true;
  std::mutex mu;
  std::vector<std::string> errors;
  run_inproc(2, [&](int rank, std::shared_ptr<Transport> t) {
    Communicator c = Communicator::world(t, o);
    std::vector<float> x(8, 1.f);
    const size_t count = rank == 1 ? 8 : 6;
    try {
      c.allreduce(x.data(), x.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
    } catch (const pwm::Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("collective mismatch"), std::string::npos) << e;
    EXPECT_NE(e.find("count=6"), std::string::npos) << e;
    EXPECT_NE(e.find("count=8"), std::string::npos) << e;
  }
}

TEST(InProcFingerprint, WithoutDebugACountMismatchIsStillAnError) {
  // A longer message than the posted receive is a transport error, not silent corruption.
  CommOptions o;
  o.timeout_s = 2;
  std::mutex mu;
  int errors = 0;
  EXPECT_ANY_THROW(run_inproc(2, [&](int rank, std::shared_ptr<Transport> t) {
    Communicator c = Communicator::world(t, o);
    std::vector<double> x(16, 1.0);
    try {
      c.allreduce(x.data(), x.data(), rank == 1 ? 16 : 4, DataType::kFloat64, ReduceOp::kSum,
                  Algorithm::kRecursiveDoubling);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      ++errors;
      throw;
    }
  }));
  EXPECT_GE(errors, 1);
}

TEST(InProcGroups, DisjointSubgroupsRunConcurrently) {
  // Ranks {1,3} reduce while {0,2} broadcast, at the same time, on different contexts.
  std::mutex mu;
  std::vector<std::string> fails;
  run_inproc(4, [&](int rank, std::shared_ptr<Transport> t) {
    if (rank == 1 || rank == 3) {
      Communicator c(t, {1, 3}, 1, CommOptions{});
      std::vector<int64_t> x(1000, rank);
      for (int it = 0; it < 20; ++it) {
        std::fill(x.begin(), x.end(), rank);
        c.allreduce(x.data(), x.data(), x.size(), DataType::kInt64, ReduceOp::kSum);
        if (x[999] != 4) {
          std::lock_guard<std::mutex> lock(mu);
          fails.push_back("subgroup {1,3} allreduce wrong");
        }
      }
    } else {
      Communicator c(t, {2, 0}, 2, CommOptions{});  // group order differs from world order
      std::vector<int32_t> x(1000, rank == 2 ? 42 : 0);
      for (int it = 0; it < 20; ++it) c.broadcast(x.data(), x.size(), DataType::kInt32, 0);
      if (x[0] != 42 || c.rank() != (rank == 2 ? 0 : 1)) {
        std::lock_guard<std::mutex> lock(mu);
        fails.push_back("subgroup {2,0} broadcast wrong");
      }
    }
  });
  EXPECT_TRUE(fails.empty()) << fails.front();
}

TEST(InProcGroups, BadGroupsAreClearErrors) {
  InProcFabric f(2);
  auto t = f.transport(0);
  EXPECT_THROW(Communicator(t, {1}, 0), pwm::Error);        // not a member
  EXPECT_THROW(Communicator(t, {0, 0}, 0), pwm::Error);     // duplicate
  EXPECT_THROW(Communicator(t, {0, 5}, 0), pwm::Error);     // out of range
  EXPECT_THROW(Communicator(t, {0, 1}, 5000), pwm::Error);  // context out of range
  Communicator c(t, {0}, 0);
  float x = 1;
  EXPECT_THROW(c.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, Algorithm::kMpi), pwm::Error);
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

}  // namespace
}  // namespace pwm::collectives

namespace pwm::collectives {
namespace {

TEST(BucketedAllreduce, EveryElementReducedOnceWhateverTheBucketSize) {
  // Units of uneven sizes tiling [0, 1000) from the end; buckets of 1..2000 elements; overlap on
  // and off. Every element must hold the sum over ranks exactly once.
  const std::vector<BucketedAllreduce::Range> units = {{900, 1000}, {500, 900}, {499, 500}, {0, 499}};
  for (size_t bucket_elems : {1u, 7u, 100u, 401u, 2000u})
    for (bool overlap : {true, false}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(3, [&](int rank, std::shared_ptr<Transport> t) {
        Communicator c = Communicator::world(t, CommOptions{});
        BucketedAllreduce br(&c, units, bucket_elems * sizeof(float), overlap);
        std::vector<float> buf(1000);
        for (int round = 0; round < 2; ++round) {
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((rank + 1) * (i % 5 + round));
          br.begin(buf.data());
          for (int u = 0; u < br.num_units(); ++u) br.unit_done(u);
          br.finish();
          for (size_t i = 0; i < buf.size(); ++i)
            if (buf[i] != static_cast<float>(6 * (i % 5 + round))) {
              std::lock_guard<std::mutex> lock(mu);
              fails.push_back(fmt::format("bucket {} overlap {} element {}: {}", bucket_elems, overlap, i, buf[i]));
              break;
            }
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

// Units with gaps between them (an expert-parallel trainer's dense gradient around the experts'
// ranges): every element of a unit is summed once, every element of a gap keeps its own value,
// flat and hierarchical, whatever the bucket size.
TEST(BucketedAllreduce, GapsBetweenUnitsAreLeftAlone) {
  const std::vector<BucketedAllreduce::Range> units = {{950, 1000}, {600, 900}, {590, 600}, {0, 400}};
  auto in_unit = [&](size_t i) {
    for (const auto& [lo, hi] : units)
      if (static_cast<int64_t>(i) >= lo && static_cast<int64_t>(i) < hi) return true;
    return false;
  };
  for (size_t bucket_elems : {7u, 100u, 2000u})
    for (bool hierarchical : {false, true}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(4, [&](int rank, std::shared_ptr<Transport> t) {
        CommOptions o = default_options();
        o.timeout_s = 8;
        Communicator flat = Communicator::world(t, o);
        Communicator inner(t, {rank / 2 * 2, rank / 2 * 2 + 1}, 5, o);
        Communicator gather(t, {rank / 2 * 2, rank / 2 * 2 + 1}, 7, o);
        Communicator outer(t, {rank % 2, 2 + rank % 2}, 6, o);
        std::unique_ptr<BucketedAllreduce> br =
            hierarchical ? std::make_unique<BucketedAllreduce>(&inner, &gather, &outer, units, bucket_elems * 4, true)
                         : std::make_unique<BucketedAllreduce>(&flat, units, bucket_elems * 4, true);
        std::vector<float> buf(1100);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((rank + 1) * (i % 5 + 1));
        br->begin(buf.data());
        for (int u = 0; u < br->num_units(); ++u) br->unit_done(u);
        br->finish();
        for (size_t i = 0; i < buf.size(); ++i) {
          const float want = static_cast<float>((in_unit(i) ? 10 : rank + 1) * (i % 5 + 1));
          if (buf[i] != want) {
            std::lock_guard<std::mutex> lock(mu);
            fails.push_back(fmt::format("bucket {} hierarchical {} element {}: {} (want {})", bucket_elems,
                                        hierarchical, i, buf[i], want));
            break;
          }
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

TEST(BucketedAllreduce, HierarchicalSumsOverBothGroups) {
  // 6 ranks as 2 "replicas" x 3 (inner groups {0,1,2}, {3,4,5}; outer groups {0,3}, {1,4},
  // {2,5}): reduce-scatter inside, AllReduce of the shard across, all-gather inside. Buckets of
  // lengths not divisible by 3 (padding), overlap on and off. Every element must hold the sum over
  // all 6 ranks (small integers: exact in float, whatever the order), and equal the flat
  // AllReduce over all 6.
  const std::vector<BucketedAllreduce::Range> units = {{900, 1000}, {500, 900}, {499, 500}, {0, 499}};
  // (Buckets of 7 elements or more: at most 256 buckets, the hierarchical form's limit.)
  for (size_t bucket_elems : {7u, 100u, 401u, 2000u})
    for (bool overlap : {true, false}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(6, [&](int rank, std::shared_ptr<Transport> t) {
        const int rep = rank / 3, idx = rank % 3;
        CommOptions o = default_options();
        o.timeout_s = 8;
        Communicator inner(t, {rep * 3, rep * 3 + 1, rep * 3 + 2}, 5, o);
        Communicator gather(t, {rep * 3, rep * 3 + 1, rep * 3 + 2}, 7, o);
        Communicator outer(t, {idx, 3 + idx}, 6, o);
        Communicator flat = Communicator::world(t, o);
        BucketedAllreduce br(&inner, &gather, &outer, units, bucket_elems * sizeof(float), overlap);
        BucketedAllreduce fr(&flat, units, bucket_elems * sizeof(float), overlap);
        std::vector<float> buf(1000), ref(1000);
        for (int round = 0; round < 2; ++round) {
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = ref[i] = static_cast<float>((rank + 1) * (i % 5 + round));
          br.begin(buf.data());
          fr.begin(ref.data());
          for (int u = 0; u < br.num_units(); ++u) br.unit_done(u);
          br.finish();
          for (int u = 0; u < fr.num_units(); ++u) fr.unit_done(u);
          fr.finish();
          for (size_t i = 0; i < buf.size(); ++i)
            if (buf[i] != static_cast<float>(21 * (i % 5 + round)) || buf[i] != ref[i]) {
              std::lock_guard<std::mutex> lock(mu);
              fails.push_back(fmt::format("bucket {} overlap {} element {}: {} (flat {})", bucket_elems, overlap, i,
                                          buf[i], ref[i]));
              break;
            }
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

// Values whose sum depends on the order of the additions (magnitudes 2^-20..2^20, both signs):
// a window reduced in another order than the whole vector's shows in the low bits.
float order_sensitive(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>((rank + 1) * 40503u);
  return std::ldexp(static_cast<float>(h % 1000003u) / 1000003.0f - 0.5f, static_cast<int>(h % 41) - 20);
}

TEST(InProc, AllreduceWindowGivesTheWholeVectorsBits) {
  // Windows of a vector of `total` elements (empty, inside one ring chunk, across chunk
  // boundaries, the whole) reduced on their own: every element holds exactly the bits the
  // AllReduce of the whole vector gives it, for every algorithm and group size; and the same
  // window reduced as a vector of its own differs (the check has teeth: the ring's order moves).
  for (int n : {1, 2, 3, 4, 5}) {
    std::mutex mu;
    std::vector<std::string> fails;
    bool moved = false;
    run_inproc(n, [&](int rank, std::shared_ptr<Transport> t) {
      CommOptions o = default_options();
      o.segment_bytes = 64;  // several segments per chunk
      Communicator c = Communicator::world(t, o);
      for (const size_t total : {size_t{1}, size_t{10}, size_t{1001}}) {
        std::vector<float> in(total), whole(total);
        for (size_t i = 0; i < total; ++i) in[i] = order_sensitive(rank, i);
        const std::vector<std::pair<size_t, size_t>> windows = {
            {0, 0}, {0, total}, {0, total / 2}, {total / 3, total / 3 + 1}, {total / 5, total - total / 5},
            {total - 1, total}};
        for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling,
                            Algorithm::kAuto}) {
          c.allreduce(in.data(), whole.data(), total, DataType::kFloat32, ReduceOp::kSum, a);
          for (const auto& [lo, hi] : windows) {
            if (lo > hi || hi > total) continue;
            std::vector<float> part(hi - lo), alone(hi - lo);
            c.iallreduce_window(in.data() + lo, part.data(), hi - lo, DataType::kFloat32, ReduceOp::kSum,
                                Communicator::Window{total, lo}, a)
                .wait();
            c.allreduce(in.data() + lo, alone.data(), hi - lo, DataType::kFloat32, ReduceOp::kSum, a);
            std::lock_guard<std::mutex> lock(mu);
            for (size_t i = lo; i < hi; ++i) {
              if (part[i - lo] != whole[i]) {
                fails.push_back(fmt::format("n {} {} total {} window [{}, {}) element {}: {} (whole vector: {})", n,
                                            algorithm_name(a), total, lo, hi, i, part[i - lo], whole[i]));
                break;
              }
              if (alone[i - lo] != whole[i]) moved = true;
            }
          }
        }
      }
      // A proper window cannot be promised by MPI's own AllReduce; a bad window is one line.
      float x = 1;
      EXPECT_THROW(c.iallreduce_window(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, Communicator::Window{2, 0},
                                       Algorithm::kMpi),
                   Error);
      EXPECT_THROW(c.iallreduce_window(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, Communicator::Window{1, 1}),
                   Error);
    });
    EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << fails.front();
    if (n >= 3) {
      EXPECT_TRUE(moved) << "n " << n << ": no window reduced alone differed from the whole vector's bits";
    }
  }
}

TEST(BucketedAllreduce, PartsReducedAsWindowsGiveTheBucketsBits) {
  // The gradient buffer of a trainer reducing in buckets, and the same buffer stored as other
  // pieces (one of two distant ranges, as pathways_train's tied piece; the others across bucket
  // boundaries) whose parts are reduced as windows of the buckets: bitwise the buckets' result,
  // for groups of 2..5 and buckets of several sizes (auto: 1/4 of the buffer).
  const std::vector<BucketedAllreduce::Range> units = {{990, 1000}, {600, 990}, {200, 600}, {0, 200}};
  const std::vector<std::vector<BucketedAllreduce::Range>> pieces = {
      {{0, 200}, {990, 1000}}, {{200, 600}}, {{600, 990}}};
  for (int n : {2, 3, 4, 5})
    for (size_t bucket_bytes : {size_t{0}, size_t{1024}, size_t{1500}, size_t{8000}}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(n, [&](int rank, std::shared_ptr<Transport> t) {
        CommOptions o = default_options();
        o.segment_bytes = 256;
        Communicator c = Communicator::world(t, o);
        std::vector<float> buf(1000);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = order_sensitive(rank, i);
        const std::vector<float> in = buf;
        BucketedAllreduce br(&c, units, bucket_bytes, true);
        br.begin(buf.data());
        for (int u = 0; u < br.num_units(); ++u) br.unit_done(u);
        br.finish();
        const std::vector<BucketedAllreduce::Cut> cuts = BucketedAllreduce::cut(units, bucket_bytes);
        for (size_t p = 0; p < pieces.size(); ++p) {
          std::vector<float> store, out;
          for (const auto& [lo, hi] : pieces[p]) store.insert(store.end(), in.begin() + lo, in.begin() + hi);
          out.assign(store.size(), 0.0f);
          std::vector<Work> works;
          size_t covered = 0;
          for (const BucketedAllreduce::Part& q : BucketedAllreduce::parts(cuts, pieces[p])) {
            works.push_back(c.iallreduce_window(store.data() + q.at, out.data() + q.at, static_cast<size_t>(q.count),
                                                DataType::kFloat32, ReduceOp::kSum,
                                                Communicator::Window{static_cast<size_t>(q.bucket_elems),
                                                                     static_cast<size_t>(q.offset)}));
            covered += static_cast<size_t>(q.count);
          }
          for (Work& w : works) w.wait();
          size_t at = 0;
          std::lock_guard<std::mutex> lock(mu);
          if (covered != store.size())
            fails.push_back(fmt::format("piece {}: parts cover {} of {}", p, covered, store.size()));
          for (const auto& [lo, hi] : pieces[p])
            for (int64_t i = lo; i < hi; ++i, ++at)
              if (out[at] != buf[static_cast<size_t>(i)] && fails.size() < 5)
                fails.push_back(fmt::format("n {} bucket bytes {} piece {} element {}: {} (buckets: {})", n,
                                            bucket_bytes, p, i, out[at], buf[static_cast<size_t>(i)]));
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

TEST(InProc, ManyCollectivesInFlightOnSeveralContexts) {
  for (int n : {2, 3}) {
    std::mutex mu;
    std::vector<std::string> all;
    run_inproc(n, [&](int, std::shared_ptr<Transport> t) {
      std::vector<int> world(n);
      for (int i = 0; i < n; ++i) world[i] = i;
      Communicator a(t, world, 3, default_options()), b(t, world, 3 + 64, default_options()),
          c(t, world, 4, default_options());
      auto f = testing::check_many_in_flight({&a, &b, &c}, 600);
      std::lock_guard<std::mutex> lock(mu);
      all.insert(all.end(), f.begin(), f.end());
    });
    EXPECT_TRUE(all.empty()) << "n=" << n << ": " << all.front();
  }
}

TEST(InProc, TagsOutsideTheTagSpaceAreRefused) {
  InProcFabric fabric(1);
  auto t = fabric.transport(0);
  char byte = 0;
  EXPECT_EQ(t->max_tag(), kLogicalTagLimit - 1);
  EXPECT_THROW(t->isend(&byte, 1, 0, kLogicalTagLimit), pwm::Error);
  EXPECT_THROW(t->irecv(&byte, 1, 0, -1), pwm::Error);
  // The largest context and sequence numbers stay inside it (a world of one rank still runs its
  // schedule through the tag computation).
  Communicator last(t, {0}, 1023, default_options());
  int64_t x = 5;
  for (int i = 0; i < 300; ++i) last.allreduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(x, 5);
  EXPECT_THROW(Communicator(t, {0}, 1024, default_options()), pwm::Error);
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

TEST(InProcInterrupt, AnInterruptedCollectiveIsAbandoned) {
  // (3 ranks: rank 2 only takes part in the barriers, as a worker outside the slice.)
  std::mutex mu;
  std::vector<std::string> fails;
  run_inproc(3, [&](int, std::shared_ptr<Transport> t) {
    Communicator world = Communicator::world(t, default_options());
    auto f = testing::check_interrupted_collective(t, world);
    std::lock_guard<std::mutex> lock(mu);
    fails.insert(fails.end(), f.begin(), f.end());
  });
  EXPECT_TRUE(fails.empty()) << fails.front();
}

}  // namespace
}  // namespace pwm::collectives
