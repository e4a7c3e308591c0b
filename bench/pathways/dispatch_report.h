// dispatch_bench's report: the rows of a run, the ratios read from them, and the output that
// scripts parse (mpi_scripts/dispatch_plot.py, sim_calibrate.sh, sim_validate.sh): the text
// table on stdout and the --json file. Controller (world rank 0) only.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/pathways/dispatch_harness.h"

namespace pwm::pathways::bench {

// Every row of the run in the order measured (fig 5/6, then 8, then 7), and lookups over them.
class Results {
 public:
  std::vector<Row> rows;

  // The SPMD rate at T (best repetition, or median), of Fig. 5/6 or of Fig. 8's own rounds;
  // 0 without such a row.
  double spmd_rate(int64_t t, bool fig8 = false, bool use_median = false) const;
  // The best rate of `mode` at T (any figure); 0 without such a row.
  double rate(Mode mode, int64_t t) const;
  // The compute a computation really had: SPMD time per computation minus that at T = 0 (checks
  // the calibration); -1 without a T = 0 row.
  double effective_us(int64_t t) const;
  // Fig. 8: the rate of one client at T; a clients row's median rate over the SPMD median.
  double one_client(int64_t t) const;
  double median_util(const Row& r) const;
};

// Prints the report, writes --json if asked (atomically: a .tmp file renamed), and returns the
// exit code: 0, or 2 if any result was wrong. `wall` and `cpu`: the controller's seconds over
// the measurements.
int report(const Bench& b, const Results& res, double wall, double cpu);

}  // namespace pwm::pathways::bench
