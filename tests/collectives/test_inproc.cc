// The collectives over the in-process transport (ranks as threads): the whole conformance
// matrix at group sizes 1..8, AllToAll's fingerprints and argument checks. The rest of the
// in-process tests: test_inproc_faults.cc (the watchdog, the fingerprint check, an interrupted
// collective), test_inproc_groups.cc (sub-groups, contexts, tags), test_inproc_buckets.cc
// (BucketedAllreduce, windows), test_inproc_models.cc (the cost model, recursive_doubling_sum,
// the clock sync's estimate).
#include <gtest/gtest.h>

#include <mutex>

#include "collectives/communicator.h"
#include "collectives/inproc_transport.h"
#include "tests/collectives/conformance.h"
#include "tests/collectives/test_inproc.h"

namespace pwm::collectives {
namespace {

using testing::ConformanceOptions;
using testing::default_options;

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

}  // namespace
}  // namespace pwm::collectives
