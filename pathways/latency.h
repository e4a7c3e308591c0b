// The runtime's latency policy: every knob that trades the controller's and the workers' CPU
// (wake-ups that preempt a worker on a shared core) against how late a completion is noticed.
// docs/pathways_waiting.md ("Waiting without spinning") explains each rule; sleep_planner.h applies
// the controller's share, the worker loop (worker.cc) the workers'.
//
// One struct, read from the environment in one place (LatencyPolicy::from_env(), which
// RuntimeOptions::from_env() and WorkerOptions::from_env() call): RuntimeOptions::latency on
// the controller, WorkerOptions::latency on each worker. Plain data: any thread.
#pragma once

namespace pwm::pathways {

struct LatencyPolicy {
  // ---- the controller's dispatcher ----
  double backoff_min_us = 10;        // first idle wait
  double backoff_max_us = 1000;      // idle waits double up to this (nothing awaited)
  // While a client waits for a run or fetch, a sequential run or one with a deadline is in
  // flight, or a scheduler holds runs: poll at least this often (PWM_PW_BACKOFF_US).
  double busy_backoff_max_us = 200;
  // A client's command wakes a sleeping dispatcher only if it planned to sleep longer than
  // this: a burst of OpByOp calls is taken in a few passes, not one wake-up per call.
  double lazy_wake_us = 50;
  // Predicted work that must remain on the devices after the dispatcher's planned wake-up for
  // a command or a wait not to wake it; also how long before the devices are predicted to run
  // dry it wakes at the latest (predictions are off by tens of microseconds).
  double reserve_us = 250;
  // The longest sleep to a predicted completion: bounds how late an unexpected message (a
  // worker's failure) is noticed while nothing is expected before then.
  double max_predicted_sleep_us = 50000;
  // Several awaited runs in flight are taken in batches of 1/batch_div of them: the dispatcher
  // sleeps until that many are predicted done (PWM_PW_BATCH_DIV; a large value: the first).
  double batch_div = 2;
  // An overdue run (running longer than its program's mean) is polled every
  // busy_backoff_max_us, or every this fraction of that mean if longer.
  double overdue_poll_fraction = 0.01;

  // ---- the workers ----
  double worker_backoff_min_us = 10;
  double worker_backoff_max_us = 100;        // while recently active (PWM_PW_WORKER_BACKOFF_US)
  double worker_idle_backoff_max_us = 1000;  // after worker_idle_after_ms without work
  double worker_idle_after_ms = 20;
  int worker_spins = 64;                     // idle passes that only yield before sleeping
  // A kernel that last ran this long (or has not run yet) is "long": the answers waiting to go
  // out (run_done, fetch replies) are flushed before it, and the worker's pass ends after it.
  double long_kernel_us = 1000;

  // The defaults, with the PWM_PW_* overrides above applied (a bad value throws pwm::Error).
  static LatencyPolicy from_env();
};

}  // namespace pwm::pathways
