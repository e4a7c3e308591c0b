#include "train/loop.h"

#include <signal.h>

#include <chrono>
#include <thread>

namespace pwm::train {

namespace {

// Whether an evaluation or a checkpoint falls after `done` steps (the last step's are the final
// ones, written after the loop).
bool every(int64_t n, int64_t done, int64_t steps) { return n > 0 && done % n == 0 && done != steps; }

}  // namespace

std::optional<std::string> run(Trainer& t, const TrainConfig& cfg, int rank) {
  const int64_t steps = cfg.workload.steps;
  // An output failed somewhere, or a step was non-finite beyond --skip-nonfinite: every rank
  // stops at the same step, before any evaluation or checkpoint of that state.
  auto stop = [&t] {
    t.fail();
    return std::nullopt;
  };
  t.start();
  for (int64_t step = t.first_step(); step < steps; ++step) {
    if (!t.step(step)) return stop();
    // Testing hooks. A compute rank dies inside its step (SPMD: after the head's forward, its
    // peers blocked in the collectives; a Pathways worker: in its step kernel, before the update);
    // this one is for a rank that only dispatches (a Pathways controller), which dies with the
    // step in flight. --step-sleep-ms paces the run so an outside kill finds it.
    if (cfg.hooks.kill_now(step, rank)) cfg.hooks.kill_self();
    if (cfg.hooks.step_sleep_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg.hooks.step_sleep_ms));
      t.pause();
    }
    const int64_t done = step + 1;
    const bool eval_now = every(cfg.workload.eval_every, done, steps);
    const bool ckpt_now = !cfg.outputs.ckpt.empty() && every(cfg.outputs.ckpt_every, done, steps);
    if (!eval_now && !ckpt_now) continue;
    if (!t.drain()) return stop();
    if (eval_now) t.report().validation(step, t.evaluate());
    if (ckpt_now && !t.save(done)) return std::nullopt;
    t.probe_peak();
    t.pause();
  }
  if (!t.drain()) return stop();
  t.probe_peak();
  t.before_final();
  t.report().validation(steps - 1, t.evaluate());
  if (!cfg.outputs.ckpt.empty() && !t.save(steps)) return std::nullopt;
  return t.finish();
}

}  // namespace pwm::train
