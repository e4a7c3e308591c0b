// How long the dispatcher sleeps when a pass found nothing to do: a pure function of the runs
// and fetches in flight, the time and the latency policy (latency.h), so that every rule can be
// tested without threads or clocks (tests/pathways/test_sleep_planner.cc).
//
// The rules (docs/pathways_waiting.md, "Waiting without spinning"):
//  - nothing awaited: the idle back-off, up to backoff_max_us; runs nobody waits for are
//    noticed within it, and waking more often would only take CPU from the workers;
//  - an awaited run (a client waits for it or fetches it, a sequential run, one with a
//    deadline) or a fetch in flight: wake when it is predicted done; several of them: when the
//    first 1/batch_div of them are (completions are taken in batches while the rest keep the
//    devices busy), but no later than reserve_us before the devices are predicted to run dry;
//  - one overdue or without a prediction: poll every busy_backoff_max_us, or every
//    overdue_poll_fraction of its program's mean time if that is longer (a 700 ms step that
//    runs late is not polled 250 times), unless the devices are about to run dry;
//  - a fetch waits behind the run its worker is executing, but is answered between kernels:
//    predicted at that run's end or one of its kernels from now, whichever comes first (never
//    sooner than the fine polling interval: many tiny kernels must not make this a spin);
//  - a scheduler holding runs back: poll every busy_backoff_max_us (runs are released when
//    earlier ones finish);
//  - a predicted completion further away than the back-off is slept to in one go, up to
//    max_predicted_sleep_us (client commands still wake the dispatcher: doorbell.h).
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include "pathways/latency.h"

namespace pwm::pathways {

// An awaited run that its workers have not all reported done.
struct AwaitedRun {
  double predicted_done = 0;  // now_s() of its predicted completion (0: no estimate yet)
  double mean_s = 0;          // its program's mean device time (0: unknown)
};

// A fetch sent to a worker, and what that worker is predicted to run before answering it.
struct PendingFetch {
  bool known = false;      // the worker runs a run with a prediction (false: it runs nothing
                           // known, or a run of a program never completed before)
  double next_done = 0;    // the predicted end of that run
  double mean_s = 0;       // that run's program's mean time on the worker
  double kernel_s = 0;     // ... over its kernels there
};

struct SleepInputs {
  std::span<const AwaitedRun> awaited;
  std::span<const PendingFetch> fetches;
  double busy_until = 0;  // the latest predicted completion of a sent, unfinished run (0: none)
  bool held = false;      // a scheduler holds runs back
};

struct SleepPlan {
  double poll_cap_us = 0;  // the back-off's cap for this sleep
  double wake_at = 0;      // now_s() to wake at for a predicted completion (0: none)
  bool held = false;

  struct Wait {
    std::chrono::microseconds duration{0};
    bool predicted = false;  // a sleep to a predicted completion (the back-off restarts after it)
  };
  // The sleep, given the back-off's next wait (taken with its cap at poll_cap_us).
  Wait wait(std::chrono::microseconds backoff, double now, const LatencyPolicy& p) const;
};

// `scratch` is storage reused between calls (its contents are ignored): no allocation per sleep.
SleepPlan plan_sleep(const SleepInputs& in, double now, const LatencyPolicy& p, std::vector<double>& scratch);

}  // namespace pwm::pathways
