// A discrete-event queue: callbacks at simulated times, run in (time, insertion) order so that
// equal times are deterministic.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace pwm::sim {

class Engine {
 public:
  using Fn = std::function<void()>;
  double now() const { return now_; }
  void at(double t, Fn fn) { q_.push({t < now_ ? now_ : t, seq_++, std::move(fn)}); }
  void run() {
    while (!q_.empty()) {
      Ev e = q_.top();
      q_.pop();
      now_ = e.t;
      e.fn();
    }
  }

 private:
  struct Ev {
    double t;
    uint64_t seq;
    Fn fn;
    bool operator>(const Ev& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> q_;
  double now_ = 0;
  uint64_t seq_ = 0;
};

// A resource used by one thing at a time (a device, a controller thread, a link port): returns
// when a job of `dur` that may start at `ready` ends, and books it.
struct Serial {
  double free_at = 0;
  double busy = 0;
  double book(double ready, double dur) {
    const double s = ready > free_at ? ready : free_at;
    free_at = s + dur;
    busy += dur;
    return free_at;
  }
};

}  // namespace pwm::sim
