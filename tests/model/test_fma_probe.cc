// model/fma_probe.h: the ISA it picks is the widest the CPU has, and it measures a rate. No
// bound on the rate is asserted (tests never assert a timing): it is a measurement, reported
// with the CPU (docs/train.md, "MFU").
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/fma_probe.h"

namespace pwm::model {
namespace {

TEST(FmaProbe, PicksTheWidestIsaAndMeasuresARate) {
  const FmaPeak p = fma_peak(0.005);
  const std::string want = __builtin_cpu_supports("avx512f")                                          ? "avx512"
                           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "avx2"
                                                                                                     : "scalar";
  EXPECT_EQ(p.isa, want);
  EXPECT_TRUE(std::isfinite(p.gflops));
  EXPECT_GT(p.gflops, 0.0);
}

}  // namespace
}  // namespace pwm::model
