// model_bench: training-step throughput of the model on one process, one thread.
//
// A step is what a trainer does: zero the gradients, forward_backward over the batch, the
// gradient norm, clipping and the AdamW update. Prints tokens/s, achieved GFLOP/s (PaLM's
// flops_per_token from Config) and the MFU against the GEMM peak measured here through the same
// gemm<float> path the model uses. --json FILE writes the figures for scripts.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <ctime>
#include <vector>

#include "common/check.h"
#include "common/time.h"
#include "train/checks.h"
#include "train/full_state.h"
#include "model/kernels.h"
#include "model/optim.h"
#include "model/params.h"
#include "model/transformer.h"

namespace {

using namespace pwm::model;
using namespace pwm::train;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Best-of-`reps` GFLOP/s of C[M,N] = op(A) op(B) through gemm<float>.
double gemm_gflops(int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, int reps) {
  return pwm::train::measure_gemm_gflops(M, N, K, reps, trans_a, trans_b);
}

struct Profile {
  double embed = 0, block_f = 0, head_f = 0, head_b = 0, block_b = 0, embed_b = 0, optim = 0;
};

int run(int argc, char** argv) {
  CLI::App app{"model_bench: one-process training-step throughput and MFU of the model"};
  Config cfg;
  int64_t batch = 16;
  int steps = 10, warmup = 3, peak_reps = 10;
  std::string json_path, backend = gemm_backend_name(gemm_backend());
  bool profile = false;
  app.add_option("--d-model", cfg.d_model, "C")->capture_default_str();
  app.add_option("--layers", cfg.n_layers, "L")->capture_default_str();
  app.add_option("--heads", cfg.n_heads, "H (query heads)")->capture_default_str();
  app.add_option("--head-dim", cfg.head_dim, "D")->capture_default_str();
  app.add_option("--d-ff", cfg.d_ff, "F (SwiGLU hidden)")->capture_default_str();
  app.add_option("--vocab", cfg.vocab, "V")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "T")->capture_default_str();
  app.add_option("--batch", batch, "B sequences per step")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--gemm", backend, "avx512 | blas | eigen")->capture_default_str();
  std::string precision = "fp32";
  app.add_option("--precision", precision, "fp32, or bf16 (bf16 products with fp32 sums, oneDNN)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--json", json_path, "write the figures to this JSON file");
  bool peak_only = false;
  app.add_option("--peak-reps", peak_reps, "sgemm 1024^3 repetitions before and after the steps, for MFU (0: no peak, no MFU)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_flag("--peak-only", peak_only, "print the GEMM peak (GFLOP/s, 1024^3 sgemm) and exit");
  bool info_only = false;
  app.add_flag("--bf16-info", info_only, "print the CPU's bf16 instructions and oneDNN's ISA, and exit");
  app.add_flag("--profile", profile, "time each piece of the step (adds a little overhead)");
  CLI11_PARSE(app, argc, argv);
  set_gemm_backend(parse_gemm_backend(backend));
  set_precision(parse_precision(precision));
  if (info_only) {
    std::printf("%s\n", bf16_info().c_str());
    return 0;
  }
  if (peak_only) {
    std::printf("%.2f\n", gemm_gflops(1024, 1024, 1024, false, false, 10));
    return 0;
  }
  if (steps < 1) PWM_THROW("--steps must be >= 1 (got {})", steps);

  const ParamLayout layout(cfg, 0, 1);
  const size_t P = static_cast<size_t>(layout.total());
  std::vector<float> params(P), grads(P), m(P, 0.0f), v(P, 0.0f);
  init_params(layout, cfg.seed, params.data());
  std::vector<int32_t> tokens(static_cast<size_t>(batch * (cfg.seq_len + 1)));
  std::mt19937 rng(0);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab - 1));
  for (auto& t : tokens) t = tok(rng);
  Workspace<float> ws(layout, batch);
  AdamWConfig opt;  // lr 1e-3, wd 0.1, clipping at 1 (the torch peer: AdamW(lr=1e-3, wd=0.1))
  const int L = static_cast<int>(cfg.n_layers);

  Profile prof;
  auto step = [&](int64_t s) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    float loss;
    if (!profile) {
      loss = forward_backward<float>(layout, params.data(), grads.data(), tokens.data(), batch,
                                     1.0f, ws, {});
    } else {
      double t = pwm::now_s();
      auto lap = [&](double& acc) { const double n = pwm::now_s(); acc += n - t; t = n; };
      embed_forward<float>(layout, params.data(), tokens.data(), ws.act);
      lap(prof.embed);
      for (int l = 0; l < L; ++l) block_forward<float>(layout, params.data(), l, ws.act, ws.scratch, {});
      lap(prof.block_f);
      loss = head_forward<float>(layout, params.data(), tokens.data(), ws.act);
      lap(prof.head_f);
      head_backward<float>(layout, params.data(), grads.data(), tokens.data(), 1.0f, ws.act, ws.scratch);
      lap(prof.head_b);
      for (int l = L - 1; l >= 0; --l)
        block_backward<float>(layout, params.data(), grads.data(), l, ws.act, ws.scratch, {});
      lap(prof.block_b);
      embed_backward<float>(layout, grads.data(), tokens.data(), ws.act);
      lap(prof.embed_b);
    }
    const double t0 = pwm::now_s();
    const double clip = clip_factor(opt, sq_norm(grads.data(), P));
    adamw_step(opt, layout, s, lr_at(opt, s), clip, params.data(), grads.data(), m.data(), v.data());
    prof.optim += pwm::now_s() - t0;
    return loss;
  };

  // The GEMM peak is measured before and after the steps and the best kept: on a shared machine
  // this keeps the MFU conservative (a slow moment lowers the step rate, not the peak).
  // (--peak-reps 0: a speed probe of the step alone, pwm_step_probe in env.sh.)
  double peak = peak_reps > 0 ? gemm_gflops(1024, 1024, 1024, false, false, peak_reps) : 0.0;
  for (int s = 0; s < warmup; ++s) step(s);
  prof = Profile{};
  set_gemm_profiling(profile);
  reset_gemm_stats();
  std::vector<double> times, cpu_times;
  // This thread's CPU time per step, beside the wall time: on a shared machine it does not count
  // the time other processes hold the core (it still counts their cache pollution).
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  float loss = 0;
  for (int s = 0; s < steps; ++s) {
    const double t0 = pwm::now_s(), c0 = cpu_now();
    loss = step(warmup + s);
    times.push_back(pwm::now_s() - t0);
    cpu_times.push_back(cpu_now() - c0);
  }
  set_gemm_profiling(false);
  const GemmStats gs = gemm_stats();
  const double step_s = median(times);
  const double tokens_per_s = static_cast<double>(batch * cfg.seq_len) / step_s;
  const double gflops = tokens_per_s * cfg.flops_per_token() / 1e9;

  if (peak_reps > 0) peak = std::max(peak, gemm_gflops(1024, 1024, 1024, false, false, peak_reps));
  const double mfu = peak > 0 ? gflops / peak : 0.0;

  std::printf("model_bench: %s batch=%lld params=%lld gemm=%s precision=%s threads=1\n",
              cfg.to_string().c_str(), static_cast<long long>(batch),
              static_cast<long long>(cfg.num_params()), backend.c_str(), precision.c_str());
  const std::string gemm_lib = precision == "bf16"   ? "oneDNN matmul, bf16 operands, fp32 sums"
                               : backend == "blas"   ? blas_info()
                               : backend == "avx512" ? "pwm AVX-512 sgemm (model/gemm_avx512.cc)"
                                                     : "Eigen";
  std::printf("%s\n", bf16_info().c_str());
  std::printf("gemm library: %s\n", gemm_lib.c_str());
  std::printf("step_ms median=%.1f min=%.1f max=%.1f  loss=%.4f\n", step_s * 1e3,
              *std::min_element(times.begin(), times.end()) * 1e3,
              *std::max_element(times.begin(), times.end()) * 1e3, loss);
  std::printf("step_cpu_ms median=%.1f (this thread's CPU time; tokens/s by it %.0f)\n",
              median(cpu_times) * 1e3,
              static_cast<double>(batch * cfg.seq_len) / median(cpu_times));
  std::printf("tokens/s=%.0f  achieved GFLOP/s=%.2f  (flops/token=%.3fM)\n", tokens_per_s, gflops,
              cfg.flops_per_token() / 1e6);
  if (peak_reps > 0)
    std::printf("gemm peak GFLOP/s=%.2f (%s 1024^3, best of 2x%d)  MFU=%.1f%%\n", peak,
                precision == "bf16" ? "bf16 gemm" : "sgemm", peak_reps, 100.0 * mfu);
  else
    std::printf("gemm peak not measured (--peak-reps 0): no MFU\n");
  if (profile) {
    const double n = steps;
    std::printf(
        "profile ms/step: embed_f=%.2f blocks_f=%.2f head_f=%.2f head_b=%.2f blocks_b=%.2f "
        "embed_b=%.2f optim=%.2f\n",
        1e3 * prof.embed / n, 1e3 * prof.block_f / n, 1e3 * prof.head_f / n, 1e3 * prof.head_b / n,
        1e3 * prof.block_b / n, 1e3 * prof.embed_b / n, 1e3 * prof.optim / n);
    std::printf("gemm: %.1f calls/step, %.2f GFLOP/step, %.1f ms/step in gemm (%.1f GFLOP/s), "
                "%.1f ms/step outside\n",
                gs.calls / n, gs.flops / n / 1e9, 1e3 * gs.seconds / n, gs.flops / gs.seconds / 1e9,
                1e3 * (median(times) - gs.seconds / n));
    std::printf("gemm by shape (op(A) op(B) MxNxK): calls/step, ms/step, GFLOP/s\n");
    for (const auto& s : gemm_stats_by_shape())
      std::printf("  %-22s %7.1f %7.2f %6.1f\n", s.shape.c_str(), s.stats.calls / n,
                  1e3 * s.stats.seconds / n, s.stats.flops / s.stats.seconds / 1e9);
    const int64_t N = batch * cfg.seq_len, C = cfg.d_model;
    std::printf("gemm GFLOP/s at model shapes: w_in fwd %.1f | w_out fwd %.1f | dW_in %.1f | "
                "d(h) %.1f\n",
                gemm_gflops(N, layout.w_in_rows(), C, false, true, 5),
                gemm_gflops(N, C, layout.w_out_rows(), false, false, 5),
                gemm_gflops(layout.w_in_rows(), C, N, true, false, 5),
                gemm_gflops(N, C, layout.w_in_rows(), false, false, 5));
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"tokens_per_s", tokens_per_s}, {"gflops", gflops},
                        {"peak_gflops", peak},          {"mfu", mfu},
                        {"flops_per_token", cfg.flops_per_token()},
                        {"params", cfg.num_params()},   {"step_ms", step_s * 1e3},
                        {"gemm", backend},              {"config", cfg.to_string()},
                        {"batch", batch},
                        {"gemm_library", gemm_lib},     {"precision", precision},
                        {"bf16_info", bf16_info()}};
    std::ofstream f(json_path);
    if (!f) PWM_THROW("cannot write --json file {}", json_path);
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pwm::run_tool_main("model_bench", argc, argv, run); }
