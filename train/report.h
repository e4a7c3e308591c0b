// What a trainer prints and writes, shared by spmd_train and pathways_train so that their
// outputs line up column for column: the progress line, the --metrics JSON lines (one per step,
// validation lines, and a last line with "final": true), computed from per-rank timings the
// trainer gathers. No MPI here: the caller gathers and passes vectors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "model/fma_probe.h"
#include "model/moe.h"
#include "train/config.h"
#include "train/figures.h"
#include "train/peak.h"

namespace pwm::train {

// A step's Mixture-of-Experts figures over all data-parallel ranks (moe_record below).
struct MoeRecord {
  double dropped_share = 0;    // choices over an expert's capacity / all choices
  double padding_share = 0;    // padding rows / rows the experts computed (the capacity's waste)
  double max_mean_tokens = 0;  // the busiest expert's choices / the mean expert's (1 = balanced)
  // The busiest expert-parallel device's rows over the mean device's, summed over the step's
  // routing calls (one MoE layer and micro-batch each; 1 = balanced, 1 without expert
  // parallelism): what a dropless layer's experts and AllToAll wait for. Exact where every rank
  // routes the same calls in one group (dp = ep, one stage); with several groups or stages their
  // calls' loads add, which evens them out.
  double device_max_mean = 0;
  double lb_loss = 0, z_loss = 0;  // per MoE layer and micro-batch, unweighted (docs/model_moe.md)
  std::vector<double> alltoall_ms;  // per rank: time inside the expert AllToAlls
  double round_trips = -1;  // pathways_train: the controller's routing round trips (-1: none to count)
  std::vector<double> route_wait_ms;  // pathways_train, per device: idle before the routed block forwards
};
// A rank's model::MoeStats as numbers to sum over ranks, and the record made of that sum over
// every data-parallel rank of `cfg` (the losses' means are per routing group: data-parallel
// ranks x micro-batches x MoE layers). The pack is [choices, dropped, expert_rows, lb_loss,
// z_loss, expert_tokens[E], call_tokens[calls x E]]: ranks that sum it must route the same number
// of calls.
// `calls` >= 0: exactly that many calls' words, those past the routed calls zero (a fixed-size
// array; more routed calls than that throw pwm::Error).
std::vector<double> pack_moe_stats(const model::MoeStats& s, int64_t experts, int64_t calls = -1);
MoeRecord moe_record(const std::vector<double>& summed, const TrainConfig& cfg);
// MoeRecord::device_max_mean of `calls` routing calls' expert_tokens ([calls x experts], summed
// over the ranks of an expert-parallel group of `ep` devices, each holding experts/ep in order).
// 0 without a call.
double device_max_mean(const double* call_tokens, size_t calls, size_t experts, int ep);

// One step as seen by every rank (vectors are indexed by rank).
struct StepRecord {
  int64_t step = 0;  // 0-based optimizer step that was just taken
  double loss = 0;   // mean training loss of the global batch
  double lr = 0;
  double grad_norm = 0;         // before clipping
  // The verdict of train::nonfinite_step on these values: the ranks skipped the update.
  bool nonfinite() const;
  double step_ms = 0;           // wall time of the step (rank 0)
  std::vector<double> compute_ms, comm_ms, wait_ms;  // per rank
  std::optional<MoeRecord> moe;  // Mixture-of-Experts models only
};

class TrainReport {
 public:
  // `ranks` compute ranks; `peak`: the per-rank GEMM peak at start-up (for MFU; train/peak.h,
  // raised by probed() and by any step faster than it). Opens --metrics (an AtomicFile:
  // PATH.tmp.<pid>, renamed onto PATH by finish()) when cfg.outputs.metrics is set. Only the reporting
  // rank creates one. Throws pwm::Error if it cannot be created.
  // A failed write (a full disk) does not throw from step()/validation(): the temporary file is
  // removed at once, later lines are dropped, and failed()/error() say so, so that the trainer
  // can stop every rank together; finish() then throws that error.
  TrainReport(const TrainConfig& cfg, const std::string& trainer, int ranks, Peak peak, bool is_reporter);
  ~TrainReport();

  // A finite step: its line (and the progress line every --log-every steps), its MFU against the
  // peak after the peak has been raised to the step's achieved rate if that was higher (the first
  // time, a line says so). A non-finite one
  // (the ranks skipped its update): while --skip-nonfinite allows, its line with "skipped": true
  // and a progress line at once; past it, no line at all and stopped() becomes true. Every rank
  // calls it with the same values, so every rank reaches the same verdict at the same step.
  void step(const StepRecord& r);
  void validation(int64_t step, double val_loss);
  // A GEMM probe through the run: its rate per compute rank (mean over them). Every rank calls it
  // with the same value.
  void probed(double gflops) { peak_.probe(gflops); }
  const Peak& peak() const { return peak_; }
  // The run must end: a non-finite step beyond --skip-nonfinite was reported.
  bool stopped() const { return !stop_error_.empty(); }
  // After stopped(): writes the metrics' last line ({"stopped": true, "step", "error",
  // "skipped_nonfinite", "steps"}: the step lines end at the last finite or skipped step) and
  // moves the file into place; prints nothing. Returns the one line that says why the run
  // stopped (with the metrics' own failure appended when they could not be written), for the
  // trainer to print once as "<program>: error: <line>".
  std::string stop();
  // Writes the final line, prints the summary, and moves the metrics file into place. Throws
  // pwm::Error with one line (nothing left under the final name) if any write failed.
  void finish(const std::string& weights_hash);

  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

  // The trainer's own figures for the final line (train/figures.h), set before finish().
  RunFigures& figures() { return figures_; }

  double tokens_per_s(double step_ms) const;
  // The model FLOP rate per compute rank (tokens/s x Config::flops_per_token / ranks), GFLOP/s,
  // and MFU = that / peak() as it stands.
  double achieved_gflops(double tokens_per_s) const;
  double mfu(double tokens_per_s) const;
  double last_loss() const { return last_loss_; }  // the last finite step's
  int64_t skipped_nonfinite() const { return skipped_; }
  double last_val_loss() const { return last_val_; }

 private:
  void write(const std::string& line);

  // MFU against the core's fp32 FMA peak (model/fma_probe.h, probed by the reporting rank at
  // start-up): fp32 runs only, else 0.
  double mfu_fma(double tps) const;

  TrainConfig cfg_;
  std::string trainer_;
  int ranks_;
  Peak peak_;
  model::FmaPeak fma_;
  bool told_raised_ = false;  // the line saying a step raised the peak was printed
  bool reporter_;
  std::unique_ptr<AtomicFile> out_;
  std::string error_;  // the first failed write
  std::string stop_error_;  // why the run stopped (a non-finite step beyond --skip-nonfinite)
  int64_t stop_step_ = -1;
  int64_t skipped_ = 0;     // non-finite steps skipped so far
  std::vector<double> step_ms_, tokens_per_s_, comm_share_;
  double last_loss_ = 0, last_val_ = -1;
  RunFigures figures_;
};

}  // namespace pwm::train
