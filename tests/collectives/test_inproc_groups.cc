// The collectives over the in-process transport on sub-groups and contexts: disjoint groups at
// once, bad groups refused, many collectives in flight on several contexts, the tag space's
// bounds.
#include <gtest/gtest.h>

#include <mutex>

#include "collectives/communicator.h"
#include "collectives/inproc_transport.h"
#include "tests/collectives/conformance.h"
#include "tests/collectives/test_inproc.h"

namespace pwm::collectives {
namespace {

using testing::default_options;

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

}  // namespace
}  // namespace pwm::collectives
