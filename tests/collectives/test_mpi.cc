// The collectives on real MPI ranks (run under mpirun by CTest at 1..5 ranks): the conformance
// matrix with MPI_Allreduce as a second reference, sub-groups, and non-blocking overlap.
// Every rank runs every test; only rank 0 prints, and any rank's failure fails the job.
#include <gtest/gtest.h>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "tests/collectives/conformance.h"

namespace pwm::collectives {
namespace {

MpiEnvironment* g_env = nullptr;

std::string first(const std::vector<std::string>& f) { return f.empty() ? "" : f.front(); }

TEST(Mpi, AllReduceMatchesAnalyticAndMpiAllreduce) {
  Communicator comm = Communicator::world(g_env->transport());
  testing::ConformanceOptions o;
  o.with_mpi = true;
  auto fails = testing::check_allreduce(comm, o);
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << first(fails);
}

TEST(Mpi, OtherCollectivesMatchAnalytic) {
  Communicator comm = Communicator::world(g_env->transport());
  testing::ConformanceOptions o;
  o.counts = {0, 1, 7, 131, 300007};
  auto fails = testing::check_other_collectives(comm, o);
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << first(fails);
}

TEST(Mpi, NonBlockingOverlap) {
  Communicator comm = Communicator::world(g_env->transport());
  auto fails = testing::check_nonblocking(comm);
  EXPECT_TRUE(fails.empty()) << first(fails);
}

TEST(Mpi, SubgroupsWorkWhileOtherRanksDoOtherThings) {
  // Odd world ranks form one group (in reverse order), even ranks another; each runs the
  // conformance subset concurrently with the other, on its own context.
  const int w = g_env->rank(), n = g_env->size();
  std::vector<int> group;
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == w % 2) group.push_back(r);
  Communicator sub(g_env->transport(), group, /*context=*/1 + w % 2);
  testing::ConformanceOptions o;
  o.counts = {0, 7, 4099};
  o.with_mpi = true;  // also exercises MPI_Comm_create_group on the subgroup
  auto fails = testing::check_allreduce(sub, o);
  if (w % 2 == 0) {
    auto more = testing::check_other_collectives(sub, o);
    fails.insert(fails.end(), more.begin(), more.end());
  }
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << first(fails);
  // Then everyone meets again on the world communicator.
  Communicator world = Communicator::world(g_env->transport());
  int64_t x = 1;
  world.allreduce(&x, &x, 1, DataType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(x, n);
}

}  // namespace
}  // namespace pwm::collectives

int main(int argc, char** argv) {
  pwm::collectives::MpiEnvironment env(&argc, &argv);
  pwm::collectives::g_env = &env;
  ::testing::InitGoogleTest(&argc, argv);
  if (env.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  if (rc != 0 && env.rank() != 0) std::fprintf(stderr, "rank %d: tests failed\n", env.rank());
  return rc;
}
