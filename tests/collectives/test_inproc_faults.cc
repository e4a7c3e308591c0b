// The collectives over the in-process transport when a collective cannot complete: the watchdog
// names the missing rank, the fingerprint check (PWM_COLL_DEBUG) names a count that differs and
// without it a mismatch is still an error, an interrupted collective is abandoned.
#include <gtest/gtest.h>

#include <mutex>

#include "collectives/communicator.h"
#include "collectives/inproc_transport.h"
#include "tests/collectives/conformance.h"
#include "tests/collectives/test_inproc.h"

namespace pwm::collectives {
namespace {

using testing::default_options;

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

TEST(InProcInterrupt, AContextIsReusableOnceDrained) {
  std::mutex mu;
  std::vector<std::string> fails;
  run_inproc(3, [&](int, std::shared_ptr<Transport> t) {
    Communicator world = Communicator::world(t, default_options());
    auto f = testing::check_context_drain(t, world, 1004, 1000);
    std::lock_guard<std::mutex> lock(mu);
    fails.insert(fails.end(), f.begin(), f.end());
  });
  EXPECT_TRUE(fails.empty()) << fails.front();
}

}  // namespace
}  // namespace pwm::collectives
