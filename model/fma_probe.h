// The core's peak rate of fp32 multiply-adds, measured: independent vector FMAs (no loads, no
// dependences between them), the widest the CPU runs (AVX-512, else AVX2, else scalar), detected
// at run time. MFU against it is MFU against the hardware (docs/train.md, "MFU"), where the GEMM
// probe (gemm_probe.h) is against what a matrix product of the step's shapes reaches.
//
// The rate is the best of many short bursts within the budget, so a burst the scheduler
// interrupts (ranks sharing cores) does not lower it. One thread; no allocation.
#pragma once

namespace pwm::model {

struct FmaPeak {
  double gflops = 0;         // fp32 FLOP/s of this core, 1e9 (one FMA = 2 FLOPs)
  const char* isa = "none";  // "avx512", "avx2" or "scalar": the instructions it ran
};

FmaPeak fma_peak(double budget_s = 0.02);

}  // namespace pwm::model
