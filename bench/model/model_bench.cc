// model_bench: training-step throughput of the model on one process, one thread.
//
// A step is what a trainer does: zero the gradients, forward_backward over the batch, the
// gradient norm, clipping and the AdamW update. Prints tokens/s, achieved GFLOP/s (PaLM's
// flops_per_token from Config) and the MFU against the GEMM peak measured here at the model's own
// shapes (model/gemm_probe.h: the step's products through the same gemm<float>, each at its best
// time over passes before and after the steps), raised to the achieved rate if that is higher
// (then the line says so): MFU never exceeds 100%. --json FILE writes the figures for scripts.
//
// main -> run: the flags (parse_flags), the model (TrainState), the timed steps (time_steps,
// train_step), then the report (print_report, print_profile with --profile, write_json with
// --json). mpi_scripts/ (model_bench.sh, env.sh) parse the printed lines and the JSON keys: keep
// their format.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/cli.h"
#include "common/time.h"
#include "train/checks.h"
#include "train/full_state.h"
#include "model/gemm_probe.h"
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

// The 1024^3 GEMM --peak-only prints (the machine's rate on a large square product; MFU is
// measured against the model's own products instead: GemmProbe).
double square_gflops(int reps) { return gemm_gflops(1024, 1024, 1024, false, false, reps); }

// This thread's CPU time: on a shared machine it does not count the time other processes hold
// the core (it still counts their cache pollution).
double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The flags, with the modes (--gemm, --precision) parsed once into their enums.
struct Options {
  Config cfg;
  int64_t batch = 16;
  int steps = 10, warmup = 3, peak_reps = 2;
  std::string json_path;
  GemmBackend backend = GemmBackend::kEigen;
  Precision precision = Precision::kFp32;
  bool profile = false, peak_only = false, info_only = false;
};

// Reads the flags into `o`. Returns CLI11's exit code when the run ends here (--help, a bad
// flag), nothing otherwise; throws on an unknown --gemm.
std::optional<int> parse_flags(int argc, char** argv, Options& o) {
  CLI::App app{"model_bench: one-process training-step throughput and MFU of the model"};
  std::string backend = gemm_backend_name(gemm_backend()), precision = "fp32";
  Config& cfg = o.cfg;
  app.add_option("--d-model", cfg.d_model, "C")->capture_default_str();
  app.add_option("--layers", cfg.n_layers, "L")->capture_default_str();
  app.add_option("--heads", cfg.n_heads, "H (query heads)")->capture_default_str();
  app.add_option("--head-dim", cfg.head_dim, "D")->capture_default_str();
  app.add_option("--d-ff", cfg.d_ff, "F (SwiGLU hidden)")->capture_default_str();
  app.add_option("--vocab", cfg.vocab, "V")->capture_default_str();
  app.add_option("--seq", cfg.seq_len, "T")->capture_default_str();
  app.add_option("--batch", o.batch, "B sequences per step")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--gemm", backend, "avx512 | blas | eigen")->capture_default_str();
  app.add_option("--precision", precision, "fp32, or bf16 (bf16 products with fp32 sums, oneDNN)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--json", o.json_path, "write the figures to this JSON file");
  app.add_option("--peak-reps", o.peak_reps,
                 "passes over the step's products (the model-shape GEMM peak) before and after the steps, for MFU "
                 "(0: no peak, no MFU)")
      ->capture_default_str();
  app.add_flag("--peak-only", o.peak_only, "print the 1024^3 GEMM rate (GFLOP/s, at --precision) and exit");
  app.add_flag("--bf16-info", o.info_only, "print the CPU's bf16 instructions and oneDNN's ISA, and exit");
  app.add_flag("--profile", o.profile, "time each piece of the step (adds a little overhead)");
  if (int code = 0; !pwm::parse_command_line(app, argc, argv, "model_bench", true, code)) return code;
  o.backend = parse_gemm_backend(backend);
  o.precision = parse_precision(precision);
  return std::nullopt;
}

// Every number by its flag, the memory the run needs and --json's file, before anything runs
// (a mistake must not cost the peak measurement and the steps first).
void check_options(const Options& o) {
  const Config& c = o.cfg;
  const std::pair<const char*, int64_t> sizes[] = {{"--d-model", c.d_model}, {"--layers", c.n_layers},
                                                   {"--heads", c.n_heads},   {"--head-dim", c.head_dim},
                                                   {"--d-ff", c.d_ff},       {"--vocab", c.vocab},
                                                   {"--seq", c.seq_len},     {"--batch", o.batch},
                                                   {"--steps", o.steps}};
  for (const auto& [flag, v] : sizes)
    if (v < 1) PWM_THROW("{} must be at least 1 (got {})", flag, v);
  if (c.head_dim % 2 != 0) PWM_THROW("--head-dim must be even for rotary embeddings (got {})", c.head_dim);
  if (c.vocab > 65536) PWM_THROW("--vocab must be at most 65536 (got {})", c.vocab);
  c.validate();
  if (o.warmup < 0) PWM_THROW("--warmup must be >= 0 (got {})", o.warmup);
  if (o.peak_reps < 0) PWM_THROW("--peak-reps must be >= 0 (got {})", o.peak_reps);
  TrainConfig tc;
  tc.model = c;
  tc.workload.global_batch = o.batch;
  tc.workload.microbatches = 1;
  const double need = estimated_memory_bytes(tc), have = available_memory_bytes();
  if (have >= 0 && need > have) {
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    PWM_THROW("this run needs about {:.1f} GiB of memory (parameters, gradients, AdamW moments and activations) "
              "but this host has {:.1f} GiB available: use a smaller --seq, --batch or model",
              need / GiB, have / GiB);
  }
  if (!o.json_path.empty()) pwm::check_output_path("--json", o.json_path);
}

// Everything a step touches: the model's parameters, gradients and AdamW moments (one process,
// the whole model), a workspace for `batch` sequences and one fixed batch of random tokens.
struct TrainState {
  TrainState(const Config& cfg, int64_t batch_)
      : layout(cfg, 0, 1), P(static_cast<size_t>(layout.total())), batch(batch_), params(P),
        grads(P), m(P, 0.0f), v(P, 0.0f),
        tokens(static_cast<size_t>(batch * (cfg.seq_len + 1))), ws(layout, batch) {
    init_params(layout, cfg.seed, params.data());
    std::mt19937 rng(0);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab - 1));
    for (auto& t : tokens) t = tok(rng);
  }
  const ParamLayout layout;
  const size_t P;
  const int64_t batch;
  std::vector<float> params, grads, m, v;
  std::vector<int32_t> tokens;  // [batch, T+1]
  Workspace<float> ws;
  AdamWConfig opt;  // lr 1e-3, wd 0.1, clipping at 1 (the torch peer: AdamW(lr=1e-3, wd=0.1))
};

// Seconds spent in each piece of the steps since the last reset (--profile).
struct Profile {
  double embed = 0, block_f = 0, head_f = 0, head_b = 0, block_b = 0, embed_b = 0, optim = 0;
};

// forward_backward taken apart into the pieces it runs, each timed into `prof`: the same work,
// plus a clock read per piece.
float profiled_forward_backward(TrainState& st, Profile& prof) {
  const ParamLayout& layout = st.layout;
  const float* p = st.params.data();
  float* g = st.grads.data();
  const int32_t* tokens = st.tokens.data();
  auto& ws = st.ws;
  const int L = static_cast<int>(layout.config().n_layers);
  double t = pwm::now_s();
  auto lap = [&](double& acc) { const double n = pwm::now_s(); acc += n - t; t = n; };
  embed_forward<float>(layout, p, tokens, ws.act);
  lap(prof.embed);
  for (int l = 0; l < L; ++l) block_forward<float>(layout, p, l, ws.act, ws.scratch, {});
  lap(prof.block_f);
  const float loss = head_forward<float>(layout, p, tokens, ws.act);
  lap(prof.head_f);
  head_backward<float>(layout, p, g, tokens, 1.0f, ws.act, ws.scratch);
  lap(prof.head_b);
  for (int l = L - 1; l >= 0; --l) block_backward<float>(layout, p, g, l, ws.act, ws.scratch, {});
  lap(prof.block_b);
  embed_backward<float>(layout, g, tokens, ws.act);
  lap(prof.embed_b);
  return loss;
}

// One step `s` as a trainer runs it: zero the gradients, forward_backward, the gradient norm,
// clipping and the AdamW update. Profiled piece by piece when `prof` is given.
float train_step(TrainState& st, int64_t s, Profile* prof) {
  std::fill(st.grads.begin(), st.grads.end(), 0.0f);
  const float loss = prof ? profiled_forward_backward(st, *prof)
                          : forward_backward<float>(st.layout, st.params.data(), st.grads.data(),
                                                    st.tokens.data(), st.batch, 1.0f, st.ws, {});
  const double t0 = pwm::now_s();
  const double clip = clip_factor(st.opt, sq_norm(st.grads.data(), st.P));
  adamw_step(st.opt, st.layout, s, lr_at(st.opt, s), clip, st.params.data(), st.grads.data(),
             st.m.data(), st.v.data());
  if (prof) prof->optim += pwm::now_s() - t0;
  return loss;
}

// The timed steps: wall and CPU time of each, the last loss, and (--profile) the GEMM totals and
// the pieces' times, both over the timed steps only.
struct StepTimes {
  std::vector<double> wall, cpu;
  float loss = 0;
  GemmStats gemm;
  Profile prof;
};

// `warmup` untimed steps, then `steps` timed ones. The CPU time beside the wall time: on a
// shared machine it tells a slow step from a step that waited for the core.
StepTimes time_steps(TrainState& st, const Options& o) {
  StepTimes r;
  Profile* prof = o.profile ? &r.prof : nullptr;
  for (int s = 0; s < o.warmup; ++s) train_step(st, s, prof);
  r.prof = Profile{};
  set_gemm_profiling(o.profile);
  reset_gemm_stats();
  for (int s = 0; s < o.steps; ++s) {
    const double t0 = pwm::now_s(), c0 = thread_cpu_s();
    r.loss = train_step(st, o.warmup + s, prof);
    r.wall.push_back(pwm::now_s() - t0);
    r.cpu.push_back(thread_cpu_s() - c0);
  }
  set_gemm_profiling(false);
  r.gemm = gemm_stats();
  return r;
}

// The headline figures: median step, tokens/s, achieved GFLOP/s (PaLM's flops_per_token) and
// MFU against the GEMM peak (0 when --peak-reps 0): the model-shape probe's rate, or the fastest
// step's achieved rate when that is higher (PaLM's FLOPs count the whole attention matrix where
// the causal blocks skip part of it; a step can also outrun a probe on a busy core).
struct Figures {
  double step_s, tokens_per_s, gflops, probe, peak, mfu;
  bool raised;  // the peak is the fastest step's achieved rate, above the probe's
};

Figures figures(const Options& o, const StepTimes& t, double probe) {
  Figures f;
  const double tokens = static_cast<double>(o.batch * o.cfg.seq_len);
  f.step_s = median(t.wall);
  f.tokens_per_s = tokens / f.step_s;
  f.gflops = f.tokens_per_s * o.cfg.flops_per_token() / 1e9;
  f.probe = probe;
  const double fastest = tokens / *std::min_element(t.wall.begin(), t.wall.end()) * o.cfg.flops_per_token() / 1e9;
  f.raised = probe > 0 && fastest > probe;
  f.peak = f.raised ? fastest : probe;
  f.mfu = f.peak > 0 ? f.gflops / f.peak : 0.0;
  return f;
}

// What the peak is, for the report and --json.
std::string peak_source(const Options& o, const Figures& f, size_t products) {
  const std::string probe =
      fmt::format("model-shape GEMM: the step's {} products, each its best of {} pass{} before and {} after the steps",
                  products, o.peak_reps, o.peak_reps == 1 ? "" : "es", o.peak_reps);
  if (!f.raised) return probe;
  return fmt::format("the fastest step's achieved rate, above the {:.2f} GFLOP/s of the {}", f.probe, probe);
}

// What gemm<float> calls under the chosen backend and precision, for the report.
std::string gemm_library(const Options& o) {
  if (o.precision == Precision::kBf16) return "oneDNN matmul, bf16 operands, fp32 sums";
  switch (o.backend) {
    case GemmBackend::kBlas: return blas_info();
    case GemmBackend::kAvx512: return "pwm AVX-512 sgemm (model/gemm_avx512.cc)";
    case GemmBackend::kEigen: break;
  }
  return "Eigen";
}

// The report's lines that every run prints (scripts grep "tokens/s=" and "achieved GFLOP/s=").
void print_report(const Options& o, const StepTimes& t, const Figures& f, const std::string& source) {
  const Config& cfg = o.cfg;
  std::printf("model_bench: %s batch=%lld params=%lld gemm=%s precision=%s threads=1\n",
              cfg.to_string().c_str(), static_cast<long long>(o.batch),
              static_cast<long long>(cfg.num_params()), gemm_backend_name(o.backend),
              precision_name(o.precision));
  std::printf("%s\n", bf16_info().c_str());
  std::printf("gemm library: %s\n", gemm_library(o).c_str());
  std::printf("step_ms median=%.1f min=%.1f max=%.1f  loss=%.4f\n", f.step_s * 1e3,
              *std::min_element(t.wall.begin(), t.wall.end()) * 1e3,
              *std::max_element(t.wall.begin(), t.wall.end()) * 1e3, t.loss);
  std::printf("step_cpu_ms median=%.1f (this thread's CPU time; tokens/s by it %.0f)\n",
              median(t.cpu) * 1e3, static_cast<double>(o.batch * cfg.seq_len) / median(t.cpu));
  std::printf("tokens/s=%.0f  achieved GFLOP/s=%.2f  (flops/token=%.3fM)\n", f.tokens_per_s,
              f.gflops, cfg.flops_per_token() / 1e6);
  if (o.peak_reps > 0)
    std::printf("gemm peak GFLOP/s=%.2f (%s, %s)  MFU=%.1f%%\n", f.peak, source.c_str(), precision_name(o.precision),
                100.0 * f.mfu);
  else
    std::printf("gemm peak not measured (--peak-reps 0): no MFU\n");
}

// --profile: where a step's time goes, by piece of the model and by GEMM shape, and a few of the
// model's largest products timed alone.
void print_profile(const Options& o, const ParamLayout& layout, const StepTimes& t) {
  const double n = o.steps;
  const Profile& p = t.prof;
  const GemmStats& gs = t.gemm;
  std::printf(
      "profile ms/step: embed_f=%.2f blocks_f=%.2f head_f=%.2f head_b=%.2f blocks_b=%.2f "
      "embed_b=%.2f optim=%.2f\n",
      1e3 * p.embed / n, 1e3 * p.block_f / n, 1e3 * p.head_f / n, 1e3 * p.head_b / n,
      1e3 * p.block_b / n, 1e3 * p.embed_b / n, 1e3 * p.optim / n);
  std::printf("gemm: %.1f calls/step, %.2f GFLOP/step, %.1f ms/step in gemm (%.1f GFLOP/s), "
              "%.1f ms/step outside\n",
              gs.calls / n, gs.flops / n / 1e9, 1e3 * gs.seconds / n, gs.flops / gs.seconds / 1e9,
              1e3 * (median(t.wall) - gs.seconds / n));
  std::printf("gemm by shape (op(A) op(B) MxNxK): calls/step, ms/step, GFLOP/s\n");
  for (const auto& s : gemm_stats_by_shape())
    std::printf("  %-22s %7.1f %7.2f %6.1f\n", s.shape.c_str(), s.stats.calls / n,
                1e3 * s.stats.seconds / n, s.stats.flops / s.stats.seconds / 1e9);
  const int64_t N = o.batch * o.cfg.seq_len, C = o.cfg.d_model;
  std::printf("gemm GFLOP/s at model shapes: w_in fwd %.1f | w_out fwd %.1f | dW_in %.1f | "
              "d(h) %.1f\n",
              gemm_gflops(N, layout.w_in_rows(), C, false, true, 5),
              gemm_gflops(N, C, layout.w_out_rows(), false, false, 5),
              gemm_gflops(layout.w_in_rows(), C, N, true, false, 5),
              gemm_gflops(N, C, layout.w_in_rows(), false, false, 5));
}

// --json: the figures for scripts (model_bench.sh reads tokens_per_s, mfu, peak_gflops and
// bf16_info; peak_source says what the peak is, probe_gflops is the model-shape probe's rate).
void write_json(const Options& o, const Figures& f, const std::string& source) {
  const Config& cfg = o.cfg;
  nlohmann::json j = {{"tokens_per_s", f.tokens_per_s}, {"gflops", f.gflops},
                      {"peak_gflops", f.peak},          {"mfu", f.mfu},
                      {"peak_source", source},          {"probe_gflops", f.probe},
                      {"flops_per_token", cfg.flops_per_token()},
                      {"params", cfg.num_params()},     {"step_ms", f.step_s * 1e3},
                      {"gemm", gemm_backend_name(o.backend)}, {"config", cfg.to_string()},
                      {"batch", o.batch},
                      {"gemm_library", gemm_library(o)}, {"precision", precision_name(o.precision)},
                      {"bf16_info", bf16_info()}};
  pwm::write_file_atomic(o.json_path, j.dump(2) + "\n", "--json");
}

// The tool: the flags, then --bf16-info or --peak-only alone, or the peak, the steps and the
// report.
int run(int argc, char** argv) {
  Options o;
  if (const auto rc = parse_flags(argc, argv, o)) return *rc;
  if (!o.info_only && !o.peak_only) check_options(o);
  set_gemm_backend(o.backend);
  set_precision(o.precision);
  if (o.info_only) {
    std::printf("%s\n", bf16_info().c_str());
    return 0;
  }
  if (o.peak_only) {
    std::printf("%.2f\n", square_gflops(10));
    return 0;
  }
  TrainState st(o.cfg, o.batch);
  // The model-shape probe passes before and after the steps, each product's best time kept: on a
  // shared machine a slow moment then lowers the step rate, not the peak.
  // (--peak-reps 0: a speed probe of the step alone, pwm_step_probe in env.sh.)
  GemmProbe probe(st.layout, o.batch);
  for (int r = 0; r < o.peak_reps; ++r) probe.run(0);
  const StepTimes t = time_steps(st, o);
  for (int r = 0; r < o.peak_reps; ++r) probe.run(0);
  const Figures f = figures(o, t, probe.gflops());
  const std::string source = o.peak_reps > 0 ? peak_source(o, f, probe.calls().size()) : "";

  print_report(o, t, f, source);
  if (o.profile) print_profile(o, st.layout, t);
  if (!o.json_path.empty()) write_json(o, f, source);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pwm::run_tool_main("model_bench", argc, argv, run); }
