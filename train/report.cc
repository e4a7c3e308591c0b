#include "train/report.h"

#include "model/fma_probe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/check.h"
#include "common/stats.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

namespace {
nlohmann::json summary_json(const std::vector<double>& v) {
  RankSummary s = summarize_ranks(v);
  return {{"min", s.min}, {"median", s.median}, {"max", s.max}, {"slowest_rank", s.argmax}};
}

// "nan", "inf", "-inf" or the number (a NaN's sign says nothing).
std::string shown(double x) { return std::isnan(x) ? "nan" : fmt::format("{}", x); }

// Why the run stops at non-finite step `r`: the step, which value, the likely cause and what to
// change, in one line.
std::string nonfinite_message(const TrainConfig& cfg, const StepRecord& r, int64_t skipped) {
  std::string what = !std::isfinite(r.loss)
                         ? fmt::format("the training loss is {} (gradient norm {})", shown(r.loss), shown(r.grad_norm))
                         : fmt::format("the gradient norm is {} (loss {})", shown(r.grad_norm), shown(r.loss));
  if (cfg.workload.skip_nonfinite > 0)
    what += fmt::format(", after {} skipped non-finite step{} (--skip-nonfinite {})", skipped, skipped == 1 ? "" : "s",
                        cfg.workload.skip_nonfinite);
  if (r.step == cfg.hooks.nan_step) return fmt::format("step {}: {}: made NaN by the test hook --nan-step {}", r.step, what, r.step);
  std::vector<std::string> fixes{fmt::format("lower --lr (now {:g})", cfg.optim.lr)};
  if (cfg.optim.max_grad_norm <= 0) fixes.push_back("enable --max-grad-norm");
  fixes.push_back("check the data");
  if (cfg.exec.precision != Precision::kFp32) fixes.push_back("try --precision fp32");
  if (cfg.workload.skip_nonfinite == 0) fixes.push_back("skip rare bad batches with --skip-nonfinite N");
  fixes.back() = "or " + fixes.back();
  return fmt::format("step {}: {}: training diverged or the data/precision produced a non-finite value; {}", r.step,
                     what, fmt::join(fixes, ", "));
}
}  // namespace

bool StepRecord::nonfinite() const { return !std::isfinite(loss) || !std::isfinite(grad_norm); }

TrainReport::TrainReport(const TrainConfig& cfg, const std::string& trainer, int ranks, Peak peak, bool is_reporter)
    : cfg_(cfg), trainer_(trainer), ranks_(ranks), peak_(std::move(peak)), reporter_(is_reporter) {
  if (!reporter_) return;
  // The hardware's peak, on the reporting rank (every host of a job is taken to have its CPU).
  fma_ = model::fma_peak();
  if (cfg_.outputs.metrics.empty()) return;
  out_ = std::make_unique<AtomicFile>(cfg_.outputs.metrics, "--metrics");
  // The start-up peak; the final line has the one MFU was measured against.
  nlohmann::json head = {{"trainer", trainer_}, {"config", nlohmann::json::parse(cfg_.to_json())},
                         {"ranks", ranks_}, {"peak_gflops_per_rank", peak_.gflops()},
                         {"peak_source", peak_.source()}, {"flops_per_token", cfg_.model.flops_per_token()},
                         {"params", cfg_.model.num_params()},
                         {"fma_peak_gflops_per_core", fma_.gflops}, {"fma_isa", fma_.isa}};
  write(head.dump());
}

// finish() was not reached: out_'s destructor removes the partial file.
TrainReport::~TrainReport() = default;

double TrainReport::tokens_per_s(double step_ms) const {
  return step_ms > 0 ? static_cast<double>(cfg_.tokens_per_step()) / (step_ms * 1e-3) : 0.0;
}

double TrainReport::achieved_gflops(double tps) const { return tps * cfg_.model.flops_per_token() / ranks_ / 1e9; }

// Against the core's fp32 FMA peak: fp32 runs only (bf16 products run other instructions, whose
// peak this probe does not measure); 0 when not measured.
double TrainReport::mfu_fma(double tps) const {
  if (fma_.gflops <= 0 || cfg_.exec.precision != model::Precision::kFp32) return 0.0;
  return achieved_gflops(tps) / fma_.gflops;
}

// achieved / peak: the peak is at least the fastest step's achieved_gflops (step), computed the
// same way, so no step's quotient, nor the median's, exceeds 1, not even by a rounding.
double TrainReport::mfu(double tps) const {
  const double peak = peak_.gflops();
  return peak > 0 ? achieved_gflops(tps) / peak : 0.0;
}

void TrainReport::write(const std::string& line) {
  if (!out_) return;
  try {
    out_->write(line);
    out_->write("\n", 1);
    out_->flush();  // a reader (or a crash) sees whole lines
  } catch (const Error& e) {
    error_ = e.what();
    out_.reset();  // removes the temporary file
  }
}

void TrainReport::step(const StepRecord& r) {
  const bool skipped = r.nonfinite();
  if (skipped) {
    if (skipped_ >= cfg_.workload.skip_nonfinite) {  // the run ends: no line from a non-finite state
      stop_error_ = nonfinite_message(cfg_, r, skipped_);
      stop_step_ = r.step;
      return;
    }
    ++skipped_;
  } else {
    last_loss_ = r.loss;
  }
  if (!reporter_) return;
  const double tps = tokens_per_s(r.step_ms);
  // The guard that keeps MFU at or below 100%: a step faster than the peak raises it (peak.h). A
  // skipped step computed as much as any other, and its rate is in the median below.
  const double achieved = achieved_gflops(tps);
  if (achieved > peak_.gflops()) {
    if (!told_raised_)
      fmt::print("[{}] step {}: its model FLOP rate, {:.1f} GFLOP/s per rank, is above the GEMM peak of {:.1f} GFLOP/s "
                 "({}): MFU is measured against the highest achieved rate from here on\n",
                 trainer_, r.step + 1, achieved, peak_.gflops(), peak_.source());
    told_raised_ = true;
    peak_.achieved(achieved);
  }
  std::vector<double> share(r.comm_ms.size());
  for (size_t i = 0; i < share.size(); ++i) share[i] = r.step_ms > 0 ? r.comm_ms[i] / r.step_ms : 0;
  const double comm_share = median(share);
  step_ms_.push_back(r.step_ms);
  tokens_per_s_.push_back(tps);
  comm_share_.push_back(comm_share);
  nlohmann::json j = {{"step", r.step},         {"loss", r.loss},
                      {"lr", r.lr},             {"grad_norm", r.grad_norm},
                      {"tokens_per_s", tps},    {"step_ms", r.step_ms},
                      {"mfu", mfu(tps)},        {"comm_share", comm_share},
                      {"compute_ms", summary_json(r.compute_ms)},
                      {"comm_ms", summary_json(r.comm_ms)},
                      {"wait_ms", summary_json(r.wait_ms)},
                      {"skipped", skipped}};
  if (r.moe)
    j["moe"] = {{"dropped_share", r.moe->dropped_share}, {"padding_share", r.moe->padding_share},
                {"max_mean_tokens", r.moe->max_mean_tokens}, {"device_max_mean", r.moe->device_max_mean},
                {"lb_loss", r.moe->lb_loss},
                {"z_loss", r.moe->z_loss}, {"alltoall_ms", summary_json(r.moe->alltoall_ms)}};
  if (r.moe && r.moe->round_trips >= 0) {
    j["moe"]["round_trips"] = r.moe->round_trips;
    j["moe"]["route_wait_ms"] = summary_json(r.moe->route_wait_ms);
  }
  write(j.dump());  // (a skipped step's non-finite loss and norm are written as null)
  if (skipped) {
    fmt::print("[{}] step {:>5}/{} | skipped: loss {}, gradient norm {} (non-finite; {} of --skip-nonfinite {})\n",
               trainer_, r.step + 1, cfg_.workload.steps, shown(r.loss), shown(r.grad_norm), skipped_,
               cfg_.workload.skip_nonfinite);
    std::fflush(stdout);
  } else if ((r.step + 1) % cfg_.outputs.log_every == 0 || r.step + 1 == cfg_.workload.steps) {
    const RankSummary c = summarize_ranks(r.compute_ms);
    const std::string moe =
        r.moe ? fmt::format(" | moe drop {:.1f}% pad {:.1f}% max/mean {:.2f} a2a {:.1f} ms{}", 100 * r.moe->dropped_share,
                            100 * r.moe->padding_share, r.moe->max_mean_tokens, median(r.moe->alltoall_ms),
                            r.moe->round_trips > 0 ? fmt::format(" round trips {:.0f}", r.moe->round_trips) : "")
              : "";
    fmt::print("[{}] step {:>5}/{} | loss {:.4f} | {:>8.0f} tok/s | MFU {:5.1f}% of {:.1f} | {:7.1f} ms/step | comm {:4.1f}% | slowest rank {}{}{}\n",
               trainer_, r.step + 1, cfg_.workload.steps, r.loss, tps, 100 * mfu(tps), peak_.gflops(), r.step_ms, 100 * comm_share, c.argmax,
               skipped_ > 0 ? fmt::format(" | skipped {}", skipped_) : "", moe);
    std::fflush(stdout);
  }
}

std::vector<double> pack_moe_stats(const model::MoeStats& s, int64_t experts, int64_t calls) {
  std::vector<double> v = {static_cast<double>(s.choices), static_cast<double>(s.dropped),
                           static_cast<double>(s.expert_rows), s.lb_loss, s.z_loss};
  for (int64_t e = 0; e < experts; ++e)
    v.push_back(static_cast<size_t>(e) < s.expert_tokens.size() ? static_cast<double>(s.expert_tokens[e]) : 0.0);
  for (const int64_t t : s.call_tokens) v.push_back(static_cast<double>(t));
  if (calls >= 0) {
    const size_t want = 5 + static_cast<size_t>(experts * (1 + calls));
    PWM_CHECK(v.size() <= want, "{} routing calls' statistics where a step has room for {}",
              s.call_tokens.size() / static_cast<size_t>(std::max<int64_t>(experts, 1)), calls);
    v.resize(want, 0.0);
  }
  return v;
}

MoeRecord moe_record(const std::vector<double>& v, const TrainConfig& cfg) {
  const double groups = static_cast<double>(cfg.data_parallel() * cfg.workload.microbatches * cfg.model.moe_layers());
  MoeRecord r;
  const double choices = v[0], dropped = v[1], rows = v[2];
  r.dropped_share = choices > 0 ? dropped / choices : 0;
  r.padding_share = rows > 0 ? std::max(0.0, 1.0 - (choices - dropped) / rows) : 0;
  r.lb_loss = groups > 0 ? v[3] / groups : 0;
  r.z_loss = groups > 0 ? v[4] / groups : 0;
  const auto E = static_cast<size_t>(cfg.model.experts);
  PWM_CHECK(v.size() >= 5 + E && (v.size() - 5) % E == 0, "MoE statistics of {} words for {} experts", v.size(), E);
  double mx = 0, sum = 0;
  for (size_t i = 5; i < 5 + E; ++i) {
    mx = std::max(mx, v[i]);
    sum += v[i];
  }
  r.max_mean_tokens = sum > 0 ? mx / (sum / static_cast<double>(E)) : 0;
  r.device_max_mean = device_max_mean(v.data() + 5 + E, (v.size() - 5 - E) / E, E, cfg.mesh.ep);
  return r;
}

double device_max_mean(const double* call_tokens, size_t calls, size_t experts, int ep) {
  // Sums of whole counts, so the figure is the same whatever order the calls were added in.
  const size_t P = static_cast<size_t>(std::max(ep, 1)), El = experts / P;
  double busiest = 0, all = 0;
  for (size_t c = 0; c < calls; ++c) {
    double mx = 0;
    for (size_t p = 0; p < P; ++p) {
      double load = 0;
      for (size_t j = 0; j < El; ++j) load += call_tokens[c * experts + p * El + j];
      mx = std::max(mx, load);
      all += load;
    }
    busiest += mx;
  }
  return all > 0 ? busiest / (all / static_cast<double>(P)) : 0;
}

void TrainReport::validation(int64_t step, double val_loss) {
  last_val_ = val_loss;
  if (!reporter_) return;
  write(nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump());
  fmt::print("[{}] step {:>5}/{} | val_loss {:.4f}\n", trainer_, step + 1, cfg_.workload.steps, val_loss);
  std::fflush(stdout);
}

void TrainReport::finish(const std::string& weights_hash) {
  if (!reporter_) return;
  if (failed()) throw Error(error_);
  // A run with no step (resumed from a checkpoint already at --steps) measured no speed and no
  // training loss: those figures are null, and the done line says why, not 0 tok/s or MFU 0%.
  const bool trained = !step_ms_.empty();
  const double tps = median(tokens_per_s_);
  nlohmann::json j = {{"final", true},
                      {"trainer", trainer_},
                      {"steps", static_cast<int64_t>(step_ms_.size())},
                      {"tokens_per_s", tps},
                      {"mfu", mfu(tps)},
                      {"peak_gflops_per_rank", peak_.gflops()},
                      {"peak_source", peak_.source()},
                      {"peak_probes", peak_.probes()},
                      {"peak_probe_gflops_per_rank", peak_.best_probe()},
                      {"fma_peak_gflops_per_core", fma_.gflops},
                      {"step_ms_p50", median(step_ms_)},
                      {"step_ms_p90", quantile(step_ms_, 0.9)},
                      {"comm_share", median(comm_share_)},
                      {"final_loss", last_loss_},
                      {"final_val_loss", last_val_},
                      {"skipped_nonfinite", skipped_},
                      {"weights_hash", weights_hash}};
  if (const double m = mfu_fma(tps); m > 0) j["mfu_fma"] = m;
  if (!trained)
    for (const char* k : {"tokens_per_s", "mfu", "step_ms_p50", "step_ms_p90", "comm_share", "final_loss"}) j[k] = nullptr;
  figures_.for_each([&](const char* k, const RunFigures::Number& v) { if (v) j[k] = *v; },
                    [&](const char* k, const RunFigures::List& v) { if (v) j[k] = *v; });
  write(j.dump());
  if (failed()) throw Error(error_);
  if (out_) {
    out_->commit();  // throws (the temporary file removed) if the last bytes cannot be stored
    out_.reset();
  }
  figures_.for_each([&](const char* k, const RunFigures::Number& v) { if (v) fmt::print("[{}] {} = {:.4f}\n", trainer_, k, *v); },
                    [&](const char* k, const RunFigures::List& v) {
                      if (v) fmt::print("[{}] {} = [{}]\n", trainer_, k, fmt::join(*v, ", "));
                    });
  if (!trained) {
    fmt::print("[{}] done: no step ran (the run started at --steps, so there was nothing to train): no speed, MFU or "
               "training loss to report; val loss {:.4f}, weights {}\n",
               trainer_, last_val_, weights_hash);
    std::fflush(stdout);
    return;
  }
  const std::string fma = mfu_fma(tps) > 0 ? fmt::format(", {:.1f}% of the core's fp32 FMA peak of {:.1f} GFLOP/s ({})",
                                                         100 * mfu_fma(tps), fma_.gflops, fma_.isa)
                                             : "";
  fmt::print("[{}] done: {:.0f} tok/s (median), MFU {:.1f}% of a GEMM peak of {:.1f} GFLOP/s per rank ({}){}, step p50 "
             "{:.1f} ms p90 {:.1f} ms, final loss {:.4f}, val loss {:.4f}, {}weights {}\n",
             trainer_, tps, 100 * mfu(tps), peak_.gflops(), peak_.source(), fma, median(step_ms_), quantile(step_ms_, 0.9),
             last_loss_, last_val_,
             skipped_ > 0 ? fmt::format("{} non-finite steps skipped, ", skipped_) : "", weights_hash);
  std::fflush(stdout);
}

std::string TrainReport::stop() {
  PWM_CHECK(stopped(), "TrainReport::stop() without a non-finite step");
  if (!reporter_ || !out_) return stop_error_;
  write(nlohmann::json{{"stopped", true},
                       {"step", stop_step_},
                       {"error", stop_error_},
                       {"skipped_nonfinite", skipped_},
                       {"steps", static_cast<int64_t>(step_ms_.size())}}
            .dump());
  if (!failed()) {
    try {
      out_->commit();
    } catch (const Error& e) {
      error_ = e.what();
    }
  }
  out_.reset();
  return failed() ? fmt::format("{} (and --metrics was not written: {})", stop_error_, error_) : stop_error_;
}

}  // namespace pwm::train
