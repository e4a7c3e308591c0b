// dispatch_bench: the Pathways paper's dispatch experiments (Fig. 5-8) on MPI ranks.
//
//   mpirun -n 3 dispatch_bench --json results/dispatch_np3.json     # 1 controller + 2 workers
//
// Fig. 5/6: a chain of computations run SPMD, op by op, as one chained program and as one fused
// kernel, against the compute time T (fig5_6_chains.cc). Fig. 7: a pipeline of k stages on
// alternating workers, parallel vs sequential dispatch (fig7_pipeline.cc). Fig. 8: multi-tenancy,
// several clients interleaving short programs (fig8_multi_tenancy.cc). The harness (flags,
// rounds, timing) is dispatch_harness.h, the output dispatch_report.h.
// Every run's result is checked (a chain of k computations from 0 ends at k); #wrong > 0 makes
// the exit code non-zero.
#include "bench/pathways/dispatch_harness.h"
#include "bench/pathways/dispatch_report.h"
#include "bench/pathways/figures.h"
#include "collectives/strings.h"
#include "common/time.h"

using namespace pwm;
using namespace pwm::pathways::bench;

int main(int argc, char** argv) {
  collectives::MpiEnvironment env(&argc, &argv);
  return collectives::run_mpi_main(env, [&]() -> int {
    BenchOptions opt;
    if (std::optional<int> code = parse_options(argc, argv, env.rank(), &opt)) return *code;
    // Every number, list and output checked on every rank before any round: a mistake is one
    // line from rank 0 and a non-zero exit everywhere, before the sweep rather than after it.
    {
      collectives::Communicator world = collectives::Communicator::world(env.transport());
      if (!collectives::agree_on_errors(world, "dispatch_bench",
                                        [&] { check_options(&opt, env.size() - 1, env.rank() == 0); }))
        return 1;
    }
    Bench b = start_bench(env, std::move(opt));
    if (env.rank() != 0) {
      run_workers(b);
      return 0;
    }
    Results res;
    const double wall0 = now_s(), cpu0 = cpu_seconds();
    run_chains(&b, &res.rows);         // Fig. 5/6
    run_multi_tenancy(&b, &res.rows);  // Fig. 8
    run_pipeline(b, &res.rows);        // Fig. 7, in a last session
    const double wall = now_s() - wall0, cpu = cpu_seconds() - cpu0;
    return report(b, res, wall, cpu);
  });
}
