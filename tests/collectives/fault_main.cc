// Deliberately broken collective programs, for the expected-failure tests:
//   collectives_fault watchdog     the last rank never joins a ring AllReduce: the others'
//                                  watchdog must name it and end the job (PWM_COLL_TIMEOUT=2)
//   collectives_fault fingerprint  rank 1 passes another count (run with PWM_COLL_DEBUG=1)
//   collectives_fault startup      the last rank stalls after MPI_Init: the others' start-up
//                                  deadline names what they wait for (PWM_COLL_TIMEOUT=2)
//   collectives_fault sizes        without the debug mode: rank 1 runs bucketed AllReduces with
//                                  other bucket sizes (longer and shorter messages than its
//                                  peers expect, several collectives in flight): a clean line
//                                  naming the op, the sizes and the peer, never memory corruption
#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collectives/bucketed_allreduce.h"
#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"

using namespace pwm::collectives;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // startup: the last rank stalls right after MPI_Init, before the start-up exchanges.
  MpiEnvironment env(&argc, &argv, [&](int rank) {
    int size = 0;
    if (mode == "startup" && std::getenv("OMPI_COMM_WORLD_SIZE")) size = std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE"));
    if (mode == "startup" && std::getenv("PMI_SIZE")) size = std::atoi(std::getenv("PMI_SIZE"));
    if (mode == "startup" && rank == size - 1) std::this_thread::sleep_for(std::chrono::seconds(30));
  });
  return run_mpi_main(env, [&] {
    Communicator comm = Communicator::world(env.transport());
    std::vector<float> x(1 << 16, 1.f);
    comm.barrier();
    if (mode == "watchdog") {
      if (env.rank() != env.size() - 1)
        comm.allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
      else
        std::this_thread::sleep_for(std::chrono::seconds(30));  // a rank that never arrives
    } else if (mode == "fingerprint") {
      const size_t count = env.rank() == 1 ? x.size() : x.size() - 5;
      comm.allreduce(x.data(), x.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
    } else if (mode == "sizes") {
      // Units of 1000 floats in backward order; buckets of 16 KB on rank 1, 4 KB elsewhere: the
      // first AllReduce already differs in count, so its messages differ in size both ways.
      std::vector<float> g(64 * 1000, 1.f);
      std::vector<BucketedAllreduce::Range> units;
      for (int64_t u = 63; u >= 0; --u) units.push_back({u * 1000, (u + 1) * 1000});
      BucketedAllreduce b(&comm, units, env.rank() == 1 ? 16000 : 4000, /*overlap=*/true);
      for (int round = 0; round < 3; ++round) {
        b.begin(g.data());
        for (int u = 0; u < b.num_units(); ++u) {
          b.unit_done(u);
          b.poll();
        }
        b.finish();
      }
    } else {
      std::fprintf(stderr, "usage: collectives_fault watchdog|fingerprint|sizes|startup\n");
      return 2;
    }
    return 0;
  });
}
