// Liveness between the controller and the workers (docs/pathways_liveness.md, "Liveness").
//
// Every wait of one side on the other has a deadline: the timeout (RuntimeOptions::timeout_s /
// WorkerOptions::timeout_s; --coll-timeout or PWM_COLL_TIMEOUT, the collectives' watchdog's).
// Each side sends a heartbeat (an empty kHeartbeat message on the control channel) every
// quarter of the timeout, bundled with whatever else goes out, and a peer heard from by no
// message for longer than the timeout is stopped, dead or stuck: the job is aborted with one
// line naming it, its host and what was awaited from it. Heartbeats cost a clock comparison per
// pass of a loop that reads the clock anyway, and one small message per peer per quarter
// timeout (75 s by default): nothing on the dispatch path.
//
// A worker inside a kernel polls nothing but from a collective's idle wait (Transport's wait
// hook), which beats, so a kernel must not compute for longer than the timeout without entering
// a collective, as an SPMD rank must reach its next collective within the watchdog's timeout.
//
// With in-job recovery (WorkerOptions::interruptible), a kernel's collective waiting for a lost
// peer is ended by the controller's cancel, read inside the wait; its watchdog, a backstop then,
// waits kInterruptibleWatchdogFactor timeouts. The controller's verdict comes at most 1.25
// timeouts after the peer's last message (the timeout and a beat interval), so it comes first
// unless the peer was lost more than 0.75 timeouts after this device entered the collective
// (a slice's devices reaching one collective that far apart).
//
// Plain data, used by one thread (the dispatcher's, or the worker loop's).
#pragma once

#include <algorithm>
#include <vector>

namespace pwm::pathways {

constexpr double kInterruptibleWatchdogFactor = 2.0;

class Liveness {
 public:
  // `peers`: the world ranks watched (the workers on the controller, {0} on a worker); world
  // ranks index a vector, so they must be small (< world size).
  Liveness(double timeout_s, const std::vector<int>& peers, double now)
      : timeout_s_(timeout_s), interval_s_(timeout_s / 4), next_s_(now + interval_s_), last_call_s_(now) {
    for (int p : peers) {
      if (p >= static_cast<int>(heard_.size())) heard_.resize(static_cast<size_t>(p) + 1, kNotWatched);
      heard_[static_cast<size_t>(p)] = now;
    }
  }

  double timeout_s() const { return timeout_s_; }
  // A message from `peer` arrived (at `now`, the time of the pass that received it).
  void heard(int peer, double now) {
    if (peer >= 0 && peer < static_cast<int>(heard_.size()) && heard_[static_cast<size_t>(peer)] != kNotWatched)
      heard_[static_cast<size_t>(peer)] = now;
  }
  // The peer left (said bye, or closed its channel): no longer watched.
  void forget(int peer) {
    if (peer >= 0 && peer < static_cast<int>(heard_.size())) heard_[static_cast<size_t>(peer)] = kNotWatched;
  }
  // Called on every pass of the loop. True at most once per interval (a quarter of the
  // timeout): send the heartbeats now. A gap of more than half the timeout since the previous
  // call means this process itself did not run (it was stopped, or sat in a long kernel): the
  // peers' silence is then counted afresh from now, so that a rank resumed after a SIGSTOP
  // does not blame the peers it could not hear.
  bool due(double now) {
    if (now - last_call_s_ > timeout_s_ / 2)
      for (double& h : heard_)
        if (h != kNotWatched) h = std::max(h, now);
    last_call_s_ = now;
    if (now < next_s_) return false;
    next_s_ = now + interval_s_;
    return true;
  }
  // The watched peers silent for longer than the timeout at `now`, longest silence first.
  std::vector<int> silent(double now) const {
    std::vector<int> s;
    for (size_t p = 0; p < heard_.size(); ++p)
      if (heard_[p] != kNotWatched && now - heard_[p] > timeout_s_) s.push_back(static_cast<int>(p));
    std::sort(s.begin(), s.end(), [&](int a, int b) { return heard_[static_cast<size_t>(a)] < heard_[static_cast<size_t>(b)]; });
    return s;
  }
  double silence(int peer, double now) const { return now - heard_.at(static_cast<size_t>(peer)); }

 private:
  static constexpr double kNotWatched = -1e300;
  double timeout_s_, interval_s_, next_s_, last_call_s_;
  std::vector<double> heard_;  // by world rank: when last heard (kNotWatched: not watched)
};

}  // namespace pwm::pathways
