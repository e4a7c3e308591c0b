// The dispatcher's start-up handshake and its liveness checks (dispatcher.h, liveness.h): the
// hellos, the heartbeats to the workers, and the line that ends the job when a worker is silent.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "common/time.h"
#include "pathways/dispatcher.h"

namespace pwm::pathways {

std::vector<std::string> Dispatcher::hello() {
  std::vector<std::string> hosts(workers_.size());
  for (int r : workers_) chan_.listen(r);
  size_t got = 0;
  std::vector<Message> inbox;
  Backoff b(opts_.latency.backoff_min_us, opts_.latency.backoff_max_us);
  // The hellos have a deadline too; the workers that said hello get heartbeats meanwhile.
  const double start = now_s();
  std::vector<bool> greeted(workers_.size() + 1, false);
  while (got < workers_.size()) {
    if (!chan_.progress(inbox)) b.idle();
    for (auto& m : inbox) {
      if (m.type == MsgType::kHeartbeat) continue;  // a worker that said hello beats
      PWM_CHECK(m.type == MsgType::kHello, "worker {} sent {} before hello", m.peer, msg_type_name(m.type));
      Hello h = decode<Hello>(m.body);
      hosts[m.peer - 1] = std::move(h.host);
      caps_[m.peer] = h.memory_cap;
      greeted[m.peer] = true;
      got++;
    }
    inbox.clear();
    const double now = now_s();
    if (live_.due(now)) {
      for (int r : workers_)
        if (greeted[r]) chan_.post(r, MsgType::kHeartbeat);
      chan_.flush();
    }
    if (got < workers_.size() && now - start > opts_.timeout_s) {
      std::vector<std::string> missing;
      for (int r : workers_)
        if (!greeted[r]) missing.push_back(fmt::format("world rank {}{}", r, t_.on_host(r)));
      t_.abort(fmt::format("pathways liveness: the controller (world rank 0{}) waited {:.1f} s for the hello of {} "
                           "(stopped, dead, or not calling run_worker); aborting the job (timeout: --coll-timeout or "
                           "PWM_COLL_TIMEOUT)",
                           t_.on_host(0), now - start, fmt::join(missing, ", ")));
    }
  }
  for (int r : workers_) live_.heard(r, now_s());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  trace_.hosts(host, hosts);
  return hosts;
}

void Dispatcher::check_liveness(double now) {
  for (int r : workers_) {
    if (!chan_.listening(r)) {
      live_.forget(r);  // it sent its final frame (bye)
      continue;
    }
    if (!shutdown_sent_) chan_.post(r, MsgType::kHeartbeat);  // (flushed with this pass's messages)
  }
  const std::vector<int> silent = live_.silent(now);
  if (silent.empty()) return;
  auto on = [&](int r) { return t_.on_host(r); };
  if (opts_.survive_worker_loss && !shutdown_sent_) {
    for (int r : silent)
      lose(r, fmt::format("silent for {:.1f} s while the controller waited for {}", live_.silence(r, now), awaited_from(r)));
    return;
  }
  std::vector<std::string> who;
  for (int r : silent) who.push_back(fmt::format("world rank {}{} (device {}) for {:.1f} s", r, on(r), r - 1, live_.silence(r, now)));
  t_.abort(fmt::format("pathways liveness: the controller (world rank 0{}) has heard nothing from {} while waiting for {}; "
                       "stopped, dead or stuck in a kernel; aborting the job (timeout: --coll-timeout or PWM_COLL_TIMEOUT)",
                       on(0), fmt::join(who, ", and "), awaited_from(silent.front())));
}

std::string Dispatcher::lost_line(int rank) const {
  return fmt::format("device {} (world rank {}{}), which was lost", rank - 1, rank, t_.on_host(rank));
}

void Dispatcher::cancel_runs_of(int rank, const std::string& reason, const std::vector<SliceRemap>& plan) {
  // A worker interrupted inside a collective of a cancelled run is out of step with the peers
  // that were not, and the messages it abandoned would match the old tags: every slice of those
  // runs goes on with a fresh context (a remapped slice has one already), its programs lowered
  // again; a run lowered for one of them that did not include the lost worker ends too.
  std::set<int> out_of_step;
  for (auto& [id, rp] : runs_)
    if (!rp->workers_done && rp->lp->workers.count(rank))
      for (const auto& [slice, gen] : rp->lp->generations) out_of_step.insert(slice);
  auto on_them = [&](const RunRec& r) {
    for (const auto& [slice, gen] : r.lp->generations)
      if (out_of_step.count(slice)) return true;
    return false;
  };
  std::vector<uint64_t> done;
  for (auto& [id, rp] : runs_) {
    RunRec& r = *rp;
    const bool had_it = r.lp->workers.count(rank) > 0;
    if (r.workers_done || !(had_it || on_them(r))) continue;
    if (!r.sent) {  // abandoned when its turn comes (dispatch(); one it had a part in: lost_of)
      if (!had_it)
        stale_.emplace(id, fmt::format("program '{}': {}, and a slice it runs on went on with a fresh context before "
                                       "the run was sent",
                                       r.prog->def.name, reason));
      continue;
    }
    // Sent: cancelled on the other workers (they answer run_done), failed.
    if (r.error.empty()) r.error = fmt::format("program '{}': {}", r.prog->def.name, reason);
    r.waiting.erase(rank);
    r.stage_waiting.erase(rank);
    for (int w : r.waiting) chan_.send(w, CancelRun{r.id, reason});
    if (r.waiting.empty()) done.push_back(id);
  }
  for (uint64_t id : done)
    if (RunRec* r = runs_.find(id)) complete_workers(*r);
  for (const SliceRemap& m : plan) out_of_step.erase(m.slice);
  try {
    for (int slice : out_of_step) c_.rm().renew_context(slice);
  } catch (const std::exception& e) {
    t_.abort(fmt::format("pathways liveness: after {}: {}; aborting the job", reason, e.what()));
  }
}

void Dispatcher::lose(int rank, const std::string& why) {
  const std::string who = fmt::format("device {} (world rank {}{})", rank - 1, rank, t_.on_host(rank));
  // The remap first: a client that hears of the failure finds its slices on their new devices.
  std::vector<SliceRemap> plan;
  try {
    plan = c_.rm().drain(rank - 1, opts_.survive_without_spare);
  } catch (const std::exception& e) {
    t_.abort(fmt::format("pathways liveness: the controller lost {} ({}) and cannot go on without it: {}; aborting the "
                         "job (--spare-workers adds spare devices)",
                         who, why, e.what()));
  }
  std::vector<std::string> moved;
  for (const SliceRemap& m : plan)
    moved.push_back(m.to_device < 0 ? fmt::format("slice {} has no spare left (lost with the device)", m.slice)
                                    : fmt::format("remapped slice {} device {} -> {}", m.slice, m.from_device, m.to_device));
  fmt::print(stderr, "pathways liveness: the controller lost {} ({}); {}; its runs are cancelled and its objects lost\n",
             who, why, moved.empty() ? std::string("it held no slice") : fmt::format("{}", fmt::join(moved, ", ")));
  std::fflush(stderr);
  lost_.insert(rank);
  workers_.erase(std::remove(workers_.begin(), workers_.end(), rank), workers_.end());
  live_.forget(rank);
  // Its last frame: a worker that was only stopped or cut off reads it if it ever runs again
  // (the frame waits in its receive queue or the network's) and leaves instead of ending the job.
  chan_.send(rank, Evict{why});
  chan_.close(rank);
  chan_.drop(rank);
  const std::string reason = fmt::format("{} was lost", who);
  cancel_runs_of(rank, reason, plan);
  reclaim_lost(rank);
  for (auto it = fetch_reqs_.begin(); it != fetch_reqs_.end();) {
    if (it->second.rank != rank) {
      ++it;
      continue;
    }
    const std::shared_ptr<FetchRec> rec = it->second.rec;  // (outlives its request's erasure)
    if (rec->error.empty()) rec->error = fmt::format("fetch of object {}: {}", rec->a->id, reason);
    it = fetch_reqs_.erase(it);
    if (--rec->left == 0) finish_fetch(*rec);
  }
  for (auto it = stats_.begin(); it != stats_.end();) {  // (answered by the workers left)
    auto& [f, v] = it->second;
    std::erase_if(v, [&](const WorkerStats& w) { return w.rank == rank; });
    if (v.size() < workers_.size()) {
      ++it;
      continue;
    }
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
    f->set(v);
    it = stats_.erase(it);
  }
  urgent_activity_ = true;
}

std::string Dispatcher::awaited_from(int rank) {
  std::vector<std::string> w;
  for (auto& [id, rp] : runs_) {
    const RunRec& r = *rp;
    if (r.stage_waiting.count(rank))
      w.push_back(fmt::format("stage_done of stage {} of run {} (program '{}')", r.stage, id, r.prog->def.name));
    else if (r.sent && r.waiting.count(rank))
      w.push_back(fmt::format("run_done of run {} (program '{}')", id, r.prog->def.name));
  }
  for (auto& [req, f] : fetch_reqs_)
    if (f.rank == rank) w.push_back(fmt::format("fetch_reply of object {}", f.rec->a->id));
  if (!stats_.empty()) w.push_back("stats_reply");
  if (shutdown_sent_) w.push_back("bye (shutdown)");
  if (w.empty()) return "its heartbeat (no work outstanding on it)";
  return w.size() == 1 ? w[0] : fmt::format("{} and {} more", w[0], w.size() - 1);
}

}  // namespace pwm::pathways
