#include "bench/pathways/bench_kernels.h"

#include <algorithm>

#include "common/time.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"

namespace pwm::pathways::bench {

namespace {
double g_iters_per_us = 0;
volatile float g_sink = 0;

float spin(int64_t iters) {
  float a = 1.0f, b = 0.5f;
  for (int64_t i = 0; i < iters; ++i) {  // two independent dependent chains
    a = a * 0.99999994f + 1e-7f;
    b = b * 0.99999988f + 2e-7f;
  }
  return a + b;
}
}  // namespace

// The fastest of many short runs: a neighbour process that takes the core for a while slows
// some of them down, not all.
void calibrate() {
  const int64_t n = 1 << 19;
  double best = 1e30;
  for (int r = 0; r < 40; ++r) {
    const double t0 = now_s();
    g_sink = spin(n);
    best = std::min(best, now_s() - t0);
  }
  g_iters_per_us = static_cast<double>(n) / std::max(best * 1e6, 1.0);
}

double iters_per_us() { return g_iters_per_us; }

void busy_compute(int64_t us) {
  if (us <= 0) return;
  PWM_CHECK(g_iters_per_us > 0, "bench::calibrate() was not called");
  g_sink = spin(static_cast<int64_t>(static_cast<double>(us) * g_iters_per_us));
}

void step(collectives::Communicator& comm, float& x, int64_t compute_us) {
  busy_compute(compute_us);
  float s = x;
  comm.allreduce(&s, &s, 1, collectives::DataType::kFloat32, collectives::ReduceOp::kSum);
  x = s - static_cast<float>(comm.size() - 1) * x + 1.0f;
}

void register_bench_kernels() {
  auto& reg = dataflow::KernelRegistry::global();
  const dataflow::ArgSpec scalar{{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated};
  const dataflow::Signature sig{{scalar}, {scalar}};
  reg.add("bench_step", sig, [](dataflow::KernelContext& ctx) {
    float x = ctx.in<float>(0)[0];
    step(ctx.comm(), x, ctx.attr(0));
    ctx.out<float>(0)[0] = x;
  }, /*collectives=*/true);
  reg.add("bench_fused", sig, [](dataflow::KernelContext& ctx) {
    float x = ctx.in<float>(0)[0];
    for (int64_t i = 0; i < ctx.attr(0); ++i) step(ctx.comm(), x, ctx.attr(1));
    ctx.out<float>(0)[0] = x;
  }, /*collectives=*/true);
  reg.add("bench_stage", sig, [](dataflow::KernelContext& ctx) {
    busy_compute(ctx.attr(0));
    ctx.out<float>(0)[0] = ctx.in<float>(0)[0] + 1.0f;
  });
}

}  // namespace pwm::pathways::bench
