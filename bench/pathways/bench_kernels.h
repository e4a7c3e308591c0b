// The computation of the dispatch benchmark (the paper's Fig. 5-7), shared by its SPMD baseline
// and the Pathways kernels so that both run exactly the same code.
//
// One computation = T microseconds of deterministic busy compute (a dependent chain of float
// multiply-adds, calibrated once per process), then a scalar AllReduce over the slice, then an
// add: x <- sum(x) - (n - 1) x + 1, which is x + 1 exactly for the small integers the chain
// produces, so every mode's result is checked: a chain of k computations from 0 ends at k.
#pragma once

#include <cstdint>
#include <span>

#include "collectives/communicator.h"

namespace pwm::pathways::bench {

// Measures this process's busy-loop speed. Call once per rank before timing anything.
void calibrate();
double iters_per_us();
// Spins for about `us` microseconds of compute; deterministic in the number of operations.
void busy_compute(int64_t us);
// One computation on `x` (one float, the same on every member of `comm`).
void step(collectives::Communicator& comm, float& x, int64_t compute_us);

// Kernels (on every rank): bench_step {T}: float32[1] replicated -> same, one step;
// bench_fused {steps, T}: `steps` steps in one kernel; bench_stage {T}: busy compute and +1,
// no collectives (a pipeline stage).
void register_bench_kernels();

}  // namespace pwm::pathways::bench
