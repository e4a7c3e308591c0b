// Waiting without spinning (docs/pathways_waiting.md).
//
// A poll loop calls idle() when a pass found nothing to do and reset() when it did something.
// The first `spins` idle passes only yield the CPU; after that each idle pass sleeps, starting at
// min_us and doubling up to max_us. On a 2-core machine shared by a controller and two workers,
// a loop that never sleeps takes a core from the computations it waits for.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace pwm::pathways {

class Backoff {
 public:
  Backoff(double min_us = 10, double max_us = 1000, int spins = 0)
      : min_us_(min_us), max_us_(max_us), spins_(spins), cur_us_(min_us) {}

  void reset() {
    idle_ = 0;
    cur_us_ = min_us_;
  }
  // The pause the next idle() would take (0: only a yield), for condition-variable waits.
  std::chrono::microseconds next_wait() const {
    if (idle_ < spins_) return std::chrono::microseconds(0);
    return std::chrono::microseconds(static_cast<int64_t>(cur_us_));
  }
  // Record an idle pass and return how long to wait (advances the back-off).
  std::chrono::microseconds advance() {
    auto w = next_wait();
    if (idle_++ >= spins_) cur_us_ = std::min(cur_us_ * 2, max_us_);
    if (w.count() > max_us_) w = std::chrono::microseconds(static_cast<int64_t>(max_us_));
    return w;
  }
  // Record an idle pass and wait.
  void idle() {
    auto w = advance();
    if (w.count() == 0)
      sched_yield();
    else
      std::this_thread::sleep_for(w);
  }
  void set_max_us(double m) { max_us_ = std::max(m, min_us_); }

 private:
  double min_us_, max_us_;
  int spins_;
  int idle_ = 0;
  double cur_us_;
};

}  // namespace pwm::pathways
