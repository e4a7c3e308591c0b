// Deterministic building blocks of the non-GEMM kernels (kernels_*.cc): a summation, a row
// maximum and exp. Private to pwm_model: include it only from model/*.cc, which are compiled with
// -ffp-contract=off (model/CMakeLists.txt), the flag these bits depend on.
//
// Every result must be a function of the values only, never of a buffer's address or of where
// a loop's SIMD body ends (Eigen's vectorized reductions and exp() on a Map peel unaligned
// elements into scalar code, so they are not used here). Sums use kLanes independent
// accumulators combined in a fixed tree; exp is one branch-free formula that the compiler
// vectorizes and that gives the same bits in the SIMD body and the scalar tail
// (-ffp-contract=off, model/CMakeLists.txt).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace pwm::model::detail {
// Internal linkage, as when these lived in one file with their callers: each kernels_*.cc gets
// its own copy, and the compiler inlines them exactly as it did then (comdat functions of external
// linkage are inlined by other rules, which changed the generated code of every caller).
namespace {

constexpr int kLanes = 16;

template <typename S, typename F>
S det_sum(int64_t n, F term) {
  S acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  for (int j = 0; i + j < n; ++j) acc[j] += term(i + j);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// max is exact, so any grouping gives the same value; kLanes lanes let it vectorize.
template <typename S>
S row_max(const S* x, int64_t n) {
  S acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  for (; i < n; ++i) acc[0] = acc[0] > x[i] ? acc[0] : x[i];
  for (int j = 1; j < kLanes; ++j) acc[0] = acc[0] > acc[j] ? acc[0] : acc[j];
  return acc[0];
}

// exp(x) for float: Cephes' expf (range reduction by ln 2, degree-6 polynomial, 2^n by building
// the exponent bits), ~1 ulp, inputs clamped to [-87.3, 88] (results stay finite and normal).
inline float exp_det(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}
// Double is only used by the finite-difference tests: the library exp.
inline double exp_det(double x) { return std::exp(x); }

}  // namespace

}  // namespace pwm::model::detail
