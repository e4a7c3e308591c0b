#include "model/fma_probe.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "common/time.h"

namespace pwm::model {

namespace {

// 16 independent accumulators: enough to hide an FMA's latency (4-5 cycles) on two FMA ports.
constexpr int kChains = 16;
volatile float g_sink;  // keeps the sums alive

__attribute__((target("avx512f"))) double burst_avx512(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1e-3f * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  for (long i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  g_sink = _mm512_reduce_add_ps(s);
  return 2.0 * 16 * kChains * static_cast<double>(iters);
}

__attribute__((target("avx2,fma"))) double burst_avx2(long iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1e-3f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
  for (long i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  g_sink = v[0] + v[7];
  return 2.0 * 8 * kChains * static_cast<double>(iters);
}

double burst_scalar(long iters) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1e-3f * static_cast<float>(c);
  for (long i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = std::fma(acc[c], 0.999f, 1e-4f);
  float s = 0;
  for (float x : acc) s += x;
  g_sink = s;
  return 2.0 * kChains * static_cast<double>(iters);
}

}  // namespace

FmaPeak fma_peak(double budget_s) {
  FmaPeak p;
  double (*burst)(long) = burst_scalar;
  p.isa = "scalar";
  if (__builtin_cpu_supports("avx512f")) {
    burst = burst_avx512;
    p.isa = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    burst = burst_avx2;
    p.isa = "avx2";
  }
  // Bursts of ~0.2 ms (a scheduler tick interrupts few of them), the best rate of those in the budget.
  long iters = 256;
  burst(iters);  // (warm: the wide units may start at a lower rate)
  const double end = now_s() + budget_s;
  do {
    const double t0 = now_s();
    const double flops = burst(iters);
    const double dt = now_s() - t0;
    if (dt < 1e-4) {
      iters *= 2;
      continue;
    }
    p.gflops = std::max(p.gflops, flops / dt / 1e9);
  } while (now_s() < end);
  return p;
}

}  // namespace pwm::model
