// The trainer's whole-model programs and its report: the pipeline's stages (and the experts'
// devices) merged into one model for evaluation, checkpoints and the weights hash; the GEMM
// probe; the layout and memory figures; the trace.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/stats.h"
#include "mpmd/trainer.h"
#include "programs/pipeline.h"
#include "programs/replicas.h"
#include "train/checks.h"
#include "train/full_state.h"
#include "train/peak.h"

namespace pwm::mpmd {

using dataflow::Value;

// A full-model array on replica r's first slice: the dense slice's arrays with each rank's
// experts from its experts' device (--expert-island); a pipeline's stages merged (every stage's
// copy of the tied weights is the same; each stage's own layers); else the slice's own.
Value Trainer::merged(dataflow::Builder& b, const std::vector<ValueState>& st, const std::vector<ValueState>& experts,
                      Value ValueState::*which, int r) const {
  std::vector<Value> in;
  std::string kernel = "merge";
  if (!experts.empty()) {
    kernel = "expert_merge";
    in.push_back(st[0].*which);
    // Each experts' device sends its experts' ranges only (expert_pack), not its whole array.
    for (size_t j = 0; j < experts.size(); ++j)
      in.push_back(b.call(names_("expert_pack"), expert_slices_.at(j), rt_.slice_size(expert_slices_.at(j)), {experts[j].*which},
                          {cfg_.mesh.tp, static_cast<int64_t>(j)})[0]);
  } else if (pipe_) {
    for (int s = 0; s < S_; ++s) in.push_back(st[static_cast<size_t>(r * S_ + s)].*which);
  } else {
    return st[static_cast<size_t>(r)].*which;
  }
  const int first = slices_.at(static_cast<size_t>(r * S_));
  return b.call(names_(kernel), first, rt_.slice_size(first), in, {cfg_.mesh.tp})[0];
}

double Trainer::evaluate() {
  const auto exe = cached("eval", [this] {
    const int tp = cfg_.mesh.tp;
    dataflow::Builder b("eval");
    std::vector<ValueState> ex;
    const auto st = state_params(b, &ex);
    const auto eval = [&](int r, std::vector<int64_t> attrs) {
      const int first = slices_.at(static_cast<size_t>(r * S_));
      return b.call(names_("eval"), first, rt_.slice_size(first), {merged(b, st, ex, &ValueState::params, r)},
                    std::move(attrs))[0];
    };
    if (R_ == 1) {
      b.output(eval(0, {tp}));
      return b.build();
    }
    // Every replica evaluates its rows of its own (identical) parameters; replica 0's first slice adds.
    std::vector<Value> sums;
    for (int r = 0; r < R_; ++r) sums.push_back(eval(r, {tp, r}));
    b.output(b.call(names_("val_total"), slices_[0], rt_.slice_size(slices_[0]), sums, {tp, R_})[0]);
    return b.build();
  });
  return rt_.get<double>(rt_.execute(*exe, state_inputs(), "eval")[0], "val loss")[0];
}

bool Trainer::save(int64_t steps_done) {  // (the state's own step counter is written)
  const auto exe = cached("save", [this] {
    dataflow::Builder b("save");
    std::vector<ValueState> ex;
    const auto st = state_params(b, &ex);
    const ValueState full{merged(b, st, ex, &ValueState::params, 0), merged(b, st, ex, &ValueState::m, 0),
                          merged(b, st, ex, &ValueState::v, 0), st[0].step};
    b.output(b.call(names_("save"), slices_[0], rt_.slice_size(slices_[0]), full.list(), {cfg_.mesh.tp})[0]);
    return b.build();
  });
  rt_.wait(rt_.execute(*exe, state_inputs(), "checkpoint")[0]);
  saved_step_ = steps_done;
  return true;  // a failed write throws on its device, which ends the job with one line
}

std::string Trainer::hash_of(int r) {
  const auto exe = cached(fmt::format("hash-{}", r), [this, r] {
    dataflow::Builder b(fmt::format("hash-{}", r));
    std::vector<ValueState> ex;
    const auto st = state_params(b, &ex);
    const int first = slices_.at(static_cast<size_t>(r * S_));
    b.output(b.call(names_("hash"), first, rt_.slice_size(first), {merged(b, st, ex, &ValueState::params, r)},
                    {cfg_.mesh.tp})[0]);
    return b.build();
  });
  const int64_t hv = rt_.get<int64_t>(rt_.execute(*exe, state_inputs(), "hash")[0], "hash")[0];
  uint64_t hash;
  std::memcpy(&hash, &hv, sizeof hash);
  return train::hash_hex(hash);
}

std::optional<std::string> Trainer::finish() {
  const std::string h = hash_of(0);
  // Replicas: no parameter was ever sent between them; every replica must still hold the same
  // bits (the same summed gradients, the same update). Checked once, at the end of the run.
  for (int r = 1; r < R_; ++r)
    if (hash_of(r) != h)
      throw Error(fmt::format("replica {}'s parameters differ from replica 0's after {} steps (the replicas' updates "
                              "diverged): a bug in the exchange", r, cfg_.workload.steps));
  if (!cfg_.outputs.trace.empty()) write_trace();
  report_->finish(h);  // (the writer writes; a failed write throws there and ends the job)
  return h;
}

double Trainer::probe(double budget_s) {  // (0: the start-up probe)
  // Every slice's devices at once (one program, its nodes side by side), then the mean over all.
  const int64_t budget_us = static_cast<int64_t>(budget_s * 1e6);
  const auto rates = rt_.fetch(
      on_slices(names_("gemm_probe"), slices_, [&](size_t) { return std::vector<int64_t>{cfg_.mesh.tp, budget_us}; },
                "gemm probe"),
      "gemm probe");
  double sum = 0, n = 0;
  for (const auto& a : rates)
    for (double r : a.as<double>()) {
      sum += r;
      ++n;
    }
  return sum / n;
}

void Trainer::probe_peak() {
  if (report_->peak().is_given()) return;  // --peak-gflops: the devices make no probe
  report_->probed(probe(train::kPeakProbeBudgetS));
}

void Trainer::report_layout_and_memory() {
  const int tp = cfg_.mesh.tp;
  if (cfg_.mpmd.spare_workers > 0) {  // in-job recoveries: each one's seconds and the steps it ran again
    report_->figures().recoveries = static_cast<double>(recovery_s_.size());
    report_->figures().recovery_s = recovery_s_;
    report_->figures().recovery_steps_run_again = recovery_steps_;
    if (R_ > 1 || replicas_dropped_ > 0) {  // (going on with fewer replicas: docs/failures.md)
      report_->figures().replicas_dropped = static_cast<double>(replicas_dropped_);
      report_->figures().replicas_left = static_cast<double>(R_);
    }
  }
  if (pipe_ && !bubbles_.empty()) {
    report_->figures().bubble = median(bubbles_);
    report_->figures().bubble_bound = static_cast<double>(S_ - 1) / static_cast<double>(cfg_.workload.microbatches + S_ - 1);
  }
  // Memory: every device's peak resident set, after the last step and before the final
  // evaluation and checkpoint (as spmd_train's: their whole-model buffers are not training
  // state), and the model state each device holds.
  int64_t peak_rss = 0, gathered = 0;  // (memory: [rss, held beyond the arrays] per device)
  const std::vector<int> all = all_slices();
  const auto mem =
      rt_.fetch(on_slices(names_("memory"), all, [&](size_t) { return std::vector<int64_t>{tp}; }, "memory"), "memory");
  std::vector<double> per_device;  // index = device; 0: a device in no slice (a spare)
  for (size_t k = 0; k < mem.size(); ++k) {
    const std::vector<int64_t> m = mem[k].as<int64_t>();
    const std::vector<int> devs = rt_.devices(all[k]);  // the slice's shards, in its device order
    PWM_CHECK_EQ(m.size(), 2 * devs.size());
    for (size_t i = 0; i + 1 < m.size(); i += 2) {
      peak_rss = std::max(peak_rss, m[i]);
      gathered = std::max(gathered, m[i + 1]);
      const auto d = static_cast<size_t>(devs[i / 2]);
      if (per_device.size() <= d) per_device.resize(d + 1, 0.0);
      per_device[d] = std::max(per_device[d], static_cast<double>(m[i]));
    }
  }
  report_->figures().peak_rss_bytes = static_cast<double>(peak_rss);
  report_->figures().peak_resident_bytes_per_device = per_device;
  train::report_memory_estimate(cfg_, /*mpmd=*/true, report_->figures());
  be_.report(*report_, all, step_.get());  // the runtime's own: store, intermediates, messages
  if (pipe_) {  // the stage layout: S slices of dp x tp devices per replica, and the island of each
    report_->figures().stages = S_;
    report_->figures().stage_dp = cfg_.mesh.dp;
    report_->figures().stage_tp = tp;
    std::vector<double> isl, regs;
    for (int sl : slices_) isl.push_back(rt_.island(sl));
    report_->figures().stage_islands = isl;
    // Each stage's activations held at once by the schedule's order (mpmd_train's --quota need).
    for (int n : programs::stage_activations(cfg_.mpmd.schedule, S_, cfg_.workload.microbatches)) regs.push_back(n);
    report_->figures().stage_activations = regs;
  }
  // The model state a device holds (docs/train.md, as spmd_train's): parameters, gradients and
  // both AdamW moments of its shard, 16 bytes a parameter (a pipeline stage's state arrays are
  // the whole layout's size: sh.total(1)). --fsdp: of its dp shard, plus the most gathered
  // weights and gradients it held at once: the kernels' own (fused's step, every evaluation), or
  // at chained and opbyop the step program's arrays and the tied pieces (never at the same time
  // as an evaluation's).
  report_->figures().state_bytes = 4.0 * static_cast<double>(sh_.state_floats(tp)) * sizeof(float) +
                                    static_cast<double>(std::max(gathered, fsdp_program_held_));
  if (R_ > 1) {
    // Bytes between replicas per step (programs/replicas.cc: each device its 1/dp of a piece).
    report_->figures().dcn_bytes_per_step = programs::replica_bytes_per_step(sh_, devices_);
    if (!exposed_.empty()) report_->figures().xchg_exposed_ms = median(exposed_);
    if (!tails_.empty()) report_->figures().xchg_tail_ms = median(tails_);
  }
}

void Trainer::write_trace() {
  // Every device's kernel spans, plus the controller's dispatch and wait rows.
  std::vector<std::string> fragments;
  if (Trace* own = be_.own_trace()) fragments.push_back(own->fragment());
  const int64_t words = 1 << 20;  // 8 MiB of trace per device at most
  std::vector<Array> per_slice;
  for (int sl : all_slices())
    per_slice.push_back(
        on_slices(names_("trace"), {sl}, [&](size_t) { return std::vector<int64_t>{cfg_.mesh.tp, words}; }, "trace")[0]);
  for (std::string& f : be_.trace_fragments(per_slice, words)) fragments.push_back(std::move(f));
  if (be_.writes_outputs()) write_trace_file(cfg_.outputs.trace, fragments, "--trace");
}

}  // namespace pwm::mpmd
