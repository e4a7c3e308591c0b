// The one run loop every trainer shares, and the small interface it drives.
//
// The loop owns the schedule of a run: the steps from the first (0, or a resumed checkpoint's),
// an evaluation every --eval-every steps, a checkpoint every --ckpt-every, the testing hooks
// (--kill-step/--kill-rank, --step-sleep-ms), then the final evaluation, checkpoint, weights
// hash and report. A trainer (spmd::Trainer, mpmd::Trainer for both MPMD models) says
// how to take a step, evaluate and save; it never repeats the schedule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "train/config.h"
#include "train/report.h"

namespace pwm::train {

// One execution model's training, as the run loop sees it. The calls below come from the ranks
// that run the loop (SPMD: every rank, collectively; Pathways: the controller alone), in this
// order: start, then step / pause / drain / evaluate / save as the schedule says, then
// drain, before_final, evaluate, save, finish; probe_peak at every pause and after the last
// step (after drain: no step is in flight while the probe runs).
class Trainer {
 public:
  virtual ~Trainer() = default;

  // The first step to take: 0, or the resumed checkpoint's step.
  virtual int64_t first_step() const = 0;
  // Before the first step (SPMD: the ranks meet and agree on the trace's time origin).
  virtual void start() {}
  // Takes step `step`. A trainer may return with the step still running (Pathways keeps two in
  // flight) and report it later; drain() finishes them. Returns false when an output failed on
  // some rank or a step it reported was non-finite beyond --skip-nonfinite (report().stopped()):
  // the loop then calls fail() and ends the run.
  virtual bool step(int64_t step) = 0;
  // Every step taken has finished and is in the report. False as step().
  virtual bool drain() { return true; }
  // What happens until the next step (an evaluation, a checkpoint, a sleep) is not part of it.
  virtual void pause() = 0;
  // Probes the GEMM peak on every compute rank (train/peak.h; nothing with --peak-gflops) and
  // hands the mean rate to report().probed. At every evaluation and checkpoint pause and after
  // the last step, with no step in flight; the pause() that follows keeps it out of a step's time.
  virtual void probe_peak() = 0;
  // The validation loss of the current parameters.
  virtual double evaluate() = 0;
  // Writes the checkpoint after `steps_done` steps; false when it failed (already reported).
  virtual bool save(int64_t steps_done) = 0;
  // After the last step, before the final evaluation and checkpoint (SPMD measures memory here,
  // before their whole-model buffers exist).
  virtual void before_final() {}
  // The weights hash, with every figure, the trace and the report's last line written; nullopt
  // when an output could not be written (already reported).
  virtual std::optional<std::string> finish() = 0;
  // After step() or drain() returned false: reports the failed output or the non-finite step
  // (one line; TrainReport::stop() ends the metrics of a non-finite stop) on every rank.
  virtual void fail() {}
  virtual TrainReport& report() = 0;
};

// Trains `t` to cfg.workload.steps (above). `rank`: this process's world rank, for the kill
// hook (a Pathways controller is world rank 0). Returns the weights hash, or nullopt when an
// output could not be written or a step was non-finite beyond --skip-nonfinite: fail() has then
// reported it and no evaluation or checkpoint followed the step.
std::optional<std::string> run(Trainer& t, const TrainConfig& cfg, int rank);

}  // namespace pwm::train
