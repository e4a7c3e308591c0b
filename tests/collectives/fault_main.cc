// Deliberately broken collective programs, for the expected-failure tests:
//   collectives_fault watchdog     the last rank never joins a ring AllReduce: the others'
//                                  watchdog must name it and end the job (PWM_COLL_TIMEOUT=2)
//   collectives_fault fingerprint  rank 1 passes another count (run with PWM_COLL_DEBUG=1)
#include <chrono>
#include <cstdio>
#include <thread>
#include <cstring>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"

using namespace pwm::collectives;

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  return run_mpi_main(env, [&] {
    const std::string mode = argc > 1 ? argv[1] : "";
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
    } else {
      std::fprintf(stderr, "usage: collectives_fault watchdog|fingerprint\n");
      return 2;
    }
    return 0;
  });
}
