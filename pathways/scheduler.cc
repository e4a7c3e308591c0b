// The proportional-share island scheduler (scheduler.h).
#include "pathways/scheduler.h"

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace pwm::pathways {

void ProportionalShareScheduler::submit(const RunTicket& t) {
  PWM_CHECK_GT(t.weight, 0.0);
  Queue& q = clients_[t.client];
  // A client that had nothing queued re-enters at the current virtual time: idle time is not
  // credit to be spent later in a burst.
  if (q.runs.empty()) q.vtime = std::max(q.vtime, vnow_);
  q.runs.push_back(t);
  held_++;
}

std::optional<uint64_t> ProportionalShareScheduler::next() {
  Queue* best = nullptr;
  for (auto& [id, q] : clients_) {
    if (q.runs.empty()) continue;
    if (!best || q.vtime < best->vtime) best = &q;  // ties: the lower client id (created first)
  }
  if (!best) return std::nullopt;
  const RunTicket& t = best->runs.front();
  const int cost = std::max(1, t.nodes);
  const bool counted = t.islands == 1;
  // The window bounds what the workers hold, so that a client arriving later is not stuck
  // behind everything already sent; a run is always released when nothing is in flight.
  if (counted && inflight_ > 0 && inflight_ + cost > window_) return std::nullopt;
  const uint64_t id = t.run_id;
  vnow_ = best->vtime;
  best->vtime += cost / t.weight;
  if (counted) {
    inflight_ += cost;
    released_[id] = cost;
  }
  best->runs.pop_front();
  held_--;
  return id;
}

void ProportionalShareScheduler::finished(uint64_t run_id) {
  auto it = released_.find(run_id);
  if (it == released_.end()) return;
  inflight_ -= it->second;
  released_.erase(it);
}

SchedulerFactory scheduler_by_name(const std::string& policy) {
  if (policy.empty() || policy == "fifo") return [](int) { return std::make_unique<FifoScheduler>(); };
  if (policy == "share" || policy.rfind("share:", 0) == 0) {
    int window = 16;
    if (policy.size() > 6) {
      try {
        window = std::stoi(policy.substr(6));
      } catch (...) {
        window = 0;
      }
      if (window < 1) PWM_THROW("scheduler policy '{}': the window after 'share:' must be a positive integer", policy);
    }
    return [window](int) { return std::make_unique<ProportionalShareScheduler>(window); };
  }
  PWM_THROW("unknown scheduler policy '{}': use fifo, share or share:N (N = node-shards in flight per island)", policy);
}

}  // namespace pwm::pathways
