// The collectives on real MPI ranks (run under mpirun by CTest at 1..5 ranks): the conformance
// matrix with MPI_Allreduce as a second reference, sub-groups, and non-blocking overlap.
// Every rank runs every test; only rank 0 prints, and any rank's failure fails the job.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

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

TEST(Mpi, AlltoallMatchesReferenceAndMpiAlltoall) {
  Communicator comm = Communicator::world(g_env->transport());
  testing::ConformanceOptions o;
  o.with_mpi = true;
  auto fails = testing::check_alltoall(comm, o);
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << first(fails);
}

TEST(Mpi, AlltoallNonBlockingOverlapsAnAllreduce) {
  Communicator comm = Communicator::world(g_env->transport());
  auto fails = testing::check_alltoall_nonblocking(comm);
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

TEST(Mpi, ManyCollectivesInFlightOnSeveralContexts) {
  std::vector<int> world(g_env->size());
  for (int i = 0; i < g_env->size(); ++i) world[i] = i;
  Communicator a(g_env->transport(), world, 3), b(g_env->transport(), world, 3 + 64),
      c(g_env->transport(), world, 4);
  auto fails = testing::check_many_in_flight({&a, &b, &c}, 600);
  EXPECT_TRUE(fails.empty()) << first(fails);
}

// Bytes that depend on their position, so a shifted or truncated copy is caught.
unsigned char pattern(size_t i) { return static_cast<unsigned char>((i * 2654435761u) >> 13); }

// A buffer in transparent huge pages where the kernel offers them: first touching 2 GiB in 4 KiB
// pages costs tens of seconds on this project's VMs, in 2 MiB pages well under one.
struct BigBuffer {
  unsigned char* p = nullptr;
  explicit BigBuffer(size_t bytes) {
    const size_t align = size_t{2} << 20, n = (bytes + align - 1) / align * align;
    p = static_cast<unsigned char*>(std::aligned_alloc(align, n));
    if (!p) throw std::bad_alloc();
    madvise(p, n, MADV_HUGEPAGE);  // advice only: an error leaves ordinary pages
  }
  ~BigBuffer() { std::free(p); }
  BigBuffer(const BigBuffer&) = delete;
  BigBuffer& operator=(const BigBuffer&) = delete;
};

// Rank 0 sends `sent` bytes to rank 1, which posts a receive of `posted` bytes and checks what
// arrived. Returns the failures seen on this rank.
std::vector<std::string> send_and_check(size_t sent, size_t posted) {
  std::vector<std::string> fails;
  Transport& t = *g_env->transport();
  const int tag = logical_tag(kFirstFreeChannel, 7);
  if (t.rank() == 0) {
    BigBuffer buf(sent);
    for (size_t i = 0; i < sent; ++i) buf.p[i] = pattern(i);
    Request r = t.isend(buf.p, sent, 1, tag);
    while (!t.test(r, nullptr)) {
    }
  } else if (t.rank() == 1) {
    BigBuffer buf(posted);
    std::memset(buf.p, 0, posted);
    Request r = t.irecv(buf.p, posted, 0, tag);
    size_t got = 0;
    while (!t.test(r, &got)) {
    }
    if (got != sent) fails.push_back(fmt::format("received {} bytes, {} were sent", got, sent));
    for (size_t i = 0; i < sent && fails.empty(); ++i)
      if (buf.p[i] != pattern(i)) fails.push_back(fmt::format("byte {} of {} wrong", i, sent));
  }
  return fails;
}

TEST(Mpi, LargeCountPathWithALoweredThreshold) {
  // The path taken past 2^31 - 1 bytes (a derived datatype; native reductions in pieces), run
  // here at a 1000-byte threshold so that it needs no 2 GiB buffers.
  if (g_env->size() < 2) GTEST_SKIP() << "needs two ranks";
  set_large_count_threshold_for_testing(1000);
  std::vector<std::string> fails;
  for (auto [sent, posted] : {std::pair<size_t, size_t>{2500, 2500}, {1000003, 1000003}, {3000, 5001}, {999, 4000}}) {
    auto f = send_and_check(sent, posted);
    fails.insert(fails.end(), f.begin(), f.end());
  }
  // Every algorithm against kMpi, whose reduction now runs in pieces of 1000 bytes.
  Communicator comm = Communicator::world(g_env->transport());
  testing::ConformanceOptions o;
  o.counts = {1, 250, 251, 300007};
  o.with_mpi = true;
  auto more = testing::check_allreduce(comm, o);
  fails.insert(fails.end(), more.begin(), more.end());
  // AllToAll: blocks past the threshold take MPI_Ialltoall's one-element-per-peer type, and an
  // alltoallv whose totals pass it MPI_Ialltoallw; kMpi's bits are compared with pairwise's.
  o.alltoall_counts = {1, 250, 251, 3001};
  more = testing::check_alltoall(comm, o);
  fails.insert(fails.end(), more.begin(), more.end());
  set_large_count_threshold_for_testing(INT32_MAX);
  EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << first(fails);
}

// MemAvailable from /proc/meminfo in bytes, 0 if unknown.
size_t available_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

TEST(Mpi, MessageJustOverTwoGiB) {
  // A real message past MPI's int count: 2^31 + 64 bytes from rank 0 to rank 1. Run by the
  // two-rank case only (both buffers live on one host there), and only with room for them.
  if (g_env->size() != 2) GTEST_SKIP() << "run by the two-rank case only";
  const size_t bytes = (size_t{1} << 31) + 64;
  int64_t room = available_memory() >= 3 * bytes ? 1 : 0;  // a buffer per rank, and headroom
  Communicator::world(g_env->transport()).allreduce(&room, &room, 1, DataType::kInt64, ReduceOp::kMin);
  if (!room) GTEST_SKIP() << "skipped: needs about 6.5 GB of available memory on this host (/proc/meminfo)";
  auto fails = send_and_check(bytes, bytes);
  EXPECT_TRUE(fails.empty()) << first(fails);
}

TEST(Mpi, AnInterruptedCollectiveIsAbandoned) {
  // Through MPI: the withdrawn receives are MPI_Cancel'ed; rank 1's messages stay unmatched.
  if (g_env->size() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator world = Communicator::world(g_env->transport());
  auto fails = testing::check_interrupted_collective(g_env->transport(), world);
  EXPECT_TRUE(fails.empty()) << first(fails);
}

TEST(Mpi, AnAbandonedSendKeepsItsBufferUntilMpiIsDone) {
  if (g_env->size() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator world = Communicator::world(g_env->transport());
  auto fails = testing::check_abandoned_send_keeps_its_buffer(g_env->transport(), world);
  EXPECT_TRUE(fails.empty()) << first(fails);
}

TEST(Mpi, AContextIsReusableOnceDrained) {
  if (g_env->size() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator world = Communicator::world(g_env->transport());
  for (auto [context, count] : {std::pair<uint32_t, size_t>{1004, 1000}, {1005, size_t{1} << 18}}) {
    auto fails = testing::check_context_drain(g_env->transport(), world, context, count);
    EXPECT_TRUE(fails.empty()) << count << " floats: " << first(fails);
  }
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
