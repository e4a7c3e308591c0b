// The dispatcher's methods (dispatcher.h). See docs/pathways.md for the protocol.
#include "pathways/dispatcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "common/time.h"
#include "pathways/messages.h"
#include "pathways/object_id.h"
#include "pathways/tags.h"

namespace pwm::pathways {

std::vector<std::string> Dispatcher::hello() {
  std::vector<std::string> hosts(workers_.size());
  for (int r : workers_) chan_.listen(r);
  size_t got = 0;
  std::vector<Message> inbox;
  Backoff b(10, 1000);
  while (got < workers_.size()) {
    if (!chan_.progress(inbox)) b.idle();
    for (auto& m : inbox) {
      PWM_CHECK(m.type == MsgType::kHello, "worker {} sent {} before hello", m.peer, msg_type_name(m.type));
      Hello h = decode<Hello>(m.body);
      hosts[m.peer - 1] = std::move(h.host);
      caps_[m.peer] = h.memory_cap;
      got++;
    }
    inbox.clear();
  }
  return hosts;
}

uint64_t Dispatcher::min_memory_cap() const {
  uint64_t m = 0;
  for (auto& [r, c] : caps_)
    if (c > 0 && (m == 0 || c < m)) m = c;
  return m;
}

void Dispatcher::init_schedulers(int islands) {
  for (int i = 0; i < islands; ++i)
    scheds_.push_back(c_.opts_.scheduler ? c_.opts_.scheduler(i) : std::make_unique<FifoScheduler>());
}

void Dispatcher::loop() {
  std::vector<Message> inbox;
  std::vector<Controller::Command> cmds;
  while (true) {
    {
      std::lock_guard<std::mutex> g(c_.mu_);
      cmds.swap(c_.queue_);
    }
    bool any = !cmds.empty();
    const bool cmds_empty = cmds.empty();
    for (auto& cmd : cmds) cmd(*this);
    cmds.clear();  // may drop handles, which queue frees: outside the lock
    any |= chan_.progress(inbox);
    for (auto& m : inbox) handle(m);
    inbox.clear();
    pump_schedulers();  // completions may have opened a window
    check_deadlines();
    post_staged();
    flush_frees();
    any |= chan_.flush();
    if (stopping_) {
      if (!shutdown_sent_ && runs_.empty() && fetch_reqs_.empty() && stats_.empty()) {
        for (int r : workers_) {
          chan_.post(r, MsgType::kShutdown);
          chan_.close(r);
        }
        shutdown_sent_ = true;
        any = true;
      }
      if (shutdown_sent_ && chan_.sends_in_flight() == 0) {
        bool all_left = true;
        for (int r : workers_) all_left = all_left && !chan_.listening(r);
        if (all_left) {
          if (!c_.opts_.trace_path.empty()) write_trace();
          break;
        }
      }
    }
    if (any) {
      // Drain everything now, but only a client's command or an answer someone waits for
      // restarts the fine polling; completions nobody waits for keep the back-off where it is.
      if (!cmds_empty || urgent_activity_) backoff_.reset();
      urgent_activity_ = false;
      continue;
    }
    // How long to sleep. Runs nobody waits for are noticed within the idle back-off (1 ms):
    // waking more often would only take CPU from the workers. A run a client waits for (or
    // fetches), a sequential run (its stages go through here) or one with a deadline is
    // polled every <= busy_backoff_max_us, except that while its predicted completion (the
    // program's mean run time) is further away the dispatcher sleeps until just before it.
    //
    // Several runs waited for at once (several clients, each waiting for its last result) are
    // taken in batches: the dispatcher sleeps until the predicted completion of half of them,
    // while the other half keeps the devices busy. Each wake-up of the controller takes a core
    // from a worker; one per completed run would cost several percent of the devices' time.
    const double now = now_s();
    predict();
    double cap_us = c_.opts_.backoff_max_us, wake_at = 0, busy_until = 0;
    std::vector<double>& pred = pred_scratch_;
    pred.clear();
    // An overdue run (running longer than its program's mean) is polled every <=
    // busy_backoff_max_us, or every 1% of that mean if longer: a 700 ms training step that runs
    // 50 ms late is then noticed within 7 ms, not with 250 wake-ups that each preempt a worker.
    double overdue_mean_s = -1;
    for (auto& [id, r] : runs_) {
      if (r->workers_done) continue;
      if (r->sent) busy_until = std::max(busy_until, r->predicted_done);
      if (!urgent(*r)) continue;
      if (r->predicted_done <= now) {
        pred.push_back(now);  // overdue (or no estimate yet)
        auto est = exec_time_.find(r->lp->id);
        const double mean = est == exec_time_.end() ? 0 : est->second;
        overdue_mean_s = overdue_mean_s < 0 ? mean : std::min(overdue_mean_s, mean);
      } else {
        pred.push_back(r->predicted_done);
      }
    }
    // A fetch sent to a worker is answered between its kernels, at once when it runs nothing.
    // Its answer is predicted at the end of the run the worker is executing, or sooner by one
    // of that run's kernels (its program's time on that worker over its kernels there): a fused
    // training step's statistics are fetched while the next 700 ms step runs, and waking every
    // millisecond in between would only preempt the worker computing it.
    for (auto& [req, f] : fetch_reqs_) {
      auto it = rank_next_done_.find(f.rank);
      if (it == rank_next_done_.end() || it->second.done <= now) {
        pred.push_back(now);
        if (it != rank_next_done_.end())
          overdue_mean_s = overdue_mean_s < 0 ? it->second.mean : std::min(overdue_mean_s, it->second.mean);
      } else {
        // Not sooner than the fine polling interval: a run of many tiny kernels must not turn
        // this into a spin.
        pred.push_back(std::min(it->second.done, now + std::max(it->second.kernel, 1e-6 * c_.opts_.busy_backoff_max_us)));
      }
    }
    if (!pred.empty()) {
      const size_t m = std::max<size_t>(1, pred.size() / batch_div_);
      std::nth_element(pred.begin(), pred.begin() + static_cast<std::ptrdiff_t>(m - 1), pred.end());
      // ... but no later than kReserveUs before the devices are predicted to run dry, which
      // leaves the clients time to submit their next runs.
      double t_m = pred[m - 1];
      if (busy_until > 0) t_m = std::min(t_m, busy_until - 1e-6 * Controller::kReserveUs);
      const bool run_dry_soon = busy_until - 1e-6 * Controller::kReserveUs <= now;  // then poll finely
      const double overdue_cap_us = run_dry_soon ? 0 : 1e6 * 0.01 * std::max(0.0, overdue_mean_s);
      if (t_m <= now)
        cap_us = std::min(cap_us, std::max(c_.opts_.busy_backoff_max_us, overdue_cap_us));
      else
        wake_at = t_m;
    }
    // Runs held back by a scheduler (proportional share) are released when earlier ones finish:
    // notice completions promptly then, or the devices idle.
    bool held = false;
    for (auto& sch : scheds_) held = held || sch->held() > 0;
    if (held) cap_us = std::min(cap_us, c_.opts_.busy_backoff_max_us);
    backoff_.set_max_us(cap_us);
    auto wait = backoff_.advance();
    bool predicted = false;
    if (wake_at > 0) {
      auto until = std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, (wake_at - now) * 1e6 - 10)));
      // A predicted completion further away than the idle back-off (a 700 ms training step) is
      // slept to in one go, up to kMaxPredictedSleepUs, instead of waking every millisecond to
      // find nothing: each of those wake-ups preempts a worker (a thousand per second cost the
      // fused trainer 1.5% of a core). Commands from clients still wake it at once.
      if (!held) until = std::min(until, std::chrono::microseconds(kMaxPredictedSleepUs));
      if (until < wait || !held) {
        wait = until;
        predicted = true;
      }
    }
    {
      std::unique_lock<std::mutex> l(c_.mu_);
      if (c_.queue_.empty() && !c_.poked_ && wait.count() > 0) {
        c_.busy_until_ = busy_until;
        c_.sleeping_until_ = now + 1e-6 * static_cast<double>(wait.count());
        c_.cv_.wait_for(l, wait, [&] { return !c_.queue_.empty() || c_.poked_; });
        c_.sleeping_until_ = 0;
      }
      c_.poked_ = false;
    }
    if (predicted) backoff_.reset();
  }
}

void Dispatcher::run(std::shared_ptr<ProgramState> p, std::vector<std::shared_ptr<ArrayState>> in,
         std::vector<std::shared_ptr<ArrayState>> out, RunOptions o, uint64_t run_id, uint64_t owner, double weight) {
  auto fail = [&](const std::string& e) {
    for (auto& a : out) a->status.fail(e);
  };
  const ProgramDef& def = p->def;
  if (closed_.count(owner))
    return fail(fmt::format("program '{}': client {} is disconnected", def.name, c_.client_name(owner)));
  if (!def.error.empty()) return fail(def.error);
  if (in.size() != def.params.size())
    return fail(fmt::format("program '{}' takes {} input(s), got {}", def.name, def.params.size(), in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const ParamDef& pd = def.params[i];
    if (in[i]->slice.id() != pd.slice || !(in[i]->spec == pd.spec))
      return fail(fmt::format("program '{}': input {} has the wrong shape or placement: expected {} on slice {}, got {} "
                              "on slice {}",
                              def.name, i, pd.spec.str(pd.num_shards), pd.slice, in[i]->spec.str(in[i]->slice.size()),
                              in[i]->slice.id()));
    // Isolation, checked again here (Client::run checked it on the client's thread).
    if (in[i]->owner != owner)
      return fail(fmt::format("program '{}': input {} (object {}) belongs to client {}, not to client {}", def.name, i,
                              in[i]->id, c_.client_name(in[i]->owner), c_.client_name(owner)));
    if (in[i]->released)
      return fail(fmt::format("program '{}': input {} (object {}) was released", def.name, i, in[i]->id));
    if (in[i]->status.failed()) return fail(fmt::format("program '{}': input {} failed: {}", def.name, i, in[i]->status.error()));
    if (!objects_.count(in[i]->id))
      return fail(fmt::format("program '{}': input {} (object {}) no longer exists", def.name, i, in[i]->id));
  }
  std::shared_ptr<LoweredProgram> lp;
  const bool fresh = !p->lowered;
  try {
    lp = lowered(*p);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  if (fresh) {
    auto& progs = programs_by_owner_[owner];
    if (progs.size() >= 64 && (progs.size() & (progs.size() - 1)) == 0)  // prune dropped programs now and then
      progs.erase(std::remove_if(progs.begin(), progs.end(), [](auto& w) { return w.expired(); }), progs.end());
    progs.push_back(p);
  }
  // Back-pressure: a run waits on a worker until its buffers fit, unless they never can.
  for (auto& [rank, wp] : lp->workers) {
    const uint64_t cap = caps_[rank], need = wp.buffer_bytes();
    if (cap > 0 && need > cap)
      return fail(fmt::format("program '{}' needs {} bytes of buffers on device {} (world rank {}) but that device's "
                              "object store is capped at {} bytes: it could never run",
                              def.name, need, rank - 1, rank, cap));
  }
  auto rec = std::make_unique<RunRec>();
  rec->id = run_id;
  rec->prog = std::move(p);
  rec->lp = lp;
  rec->in = std::move(in);
  rec->out = std::move(out);
  rec->opts = o;
  rec->owner = owner;
  rec->weight = weight;
  for (size_t k = 0; k < rec->out.size(); ++k) {
    const OutputPlacement& op = lp->outputs[k];
    objects_[rec->out[k]->id] = ObjMeta{op.slice, op.spec, op.ranks, rec->owner};
  }
  for (int r : lp->ranks()) rec->waiting.insert(r);
  rec->islands_pending = static_cast<int>(lp->islands.size());
  RunRec& rr = *rec;
  runs_[run_id] = std::move(rec);
  if (rr.islands_pending == 0) return dispatch(rr);
  const int n_islands = static_cast<int>(lp->islands.size());
  for (int island : lp->islands) {
    auto it = lp->island_execs.find(island);
    scheds_.at(island)->submit({run_id, rr.owner, it == lp->island_execs.end() ? 0 : it->second, weight, n_islands});
  }
  pump_schedulers();
}

void Dispatcher::put(std::shared_ptr<ArrayState> a, std::vector<std::vector<uint8_t>> shards) {
  std::vector<int> ranks = a->slice.devices();
  for (int& r : ranks) r += 1;
  if (closed_.count(a->owner)) return a->status.fail(fmt::format("put: client {} is disconnected", c_.client_name(a->owner)));
  for (size_t k = 0; k < ranks.size(); ++k) {
    const uint64_t cap = caps_[ranks[k]];
    if (cap > 0 && shards[k].size() > cap)
      return a->status.fail(fmt::format("put of {} bytes per shard on device {} (world rank {}), whose object store is "
                                        "capped at {} bytes: it could never fit",
                                        shards[k].size(), ranks[k] - 1, ranks[k], cap));
  }
  for (size_t k = 0; k < ranks.size(); ++k)
    chan_.send(ranks[k], PutShard{a->id, a->owner, a->spec.shard, shards[k]});
  objects_[a->id] = ObjMeta{a->slice.id(), a->spec, ranks, a->owner};
  a->status.set({});
}

void Dispatcher::fetch(std::shared_ptr<ArrayState> a, std::shared_ptr<FutureState<HostTensor>> f) {
  if (!a->status.done()) {
    waiting_fetches_.push_back({a, f});
    return;
  }
  if (a->status.failed()) return f->fail(a->status.error());
  auto it = objects_.find(a->id);
  if (it == objects_.end()) return f->fail(fmt::format("object {} no longer exists", a->id));
  const ObjMeta& m = it->second;
  const bool split = m.spec.sharding == Sharding::kSplit;
  auto rec = std::make_shared<FetchRec>();
  rec->a = a;
  rec->f = f;
  const size_t parts = split ? m.ranks.size() : 1;
  rec->parts.resize(parts);
  rec->left = parts;
  for (size_t k = 0; k < parts; ++k) {
    uint64_t req = next_req_++;
    fetch_reqs_[req] = {rec, k, m.ranks[k]};
    chan_.send(m.ranks[k], Fetch{req, a->id});
  }
}

void Dispatcher::stats(std::shared_ptr<FutureState<std::vector<WorkerStats>>> f) {
  post_staged();
  flush_frees();  // frees queued before the request are counted by it
  uint64_t req = next_req_++;
  stats_[req] = {f, {}};
  for (int r : workers_) chan_.send(r, StatsRequest{req});
}

void Dispatcher::drain(int device, bool undrain, std::shared_ptr<FutureState<std::monostate>> f) {
  if (undrain) {
    c_.rm().undrain(device);
    return f->set({});
  }
  std::vector<SliceRemap> plan;
  try {
    plan = c_.rm().drain(device);
  } catch (const std::exception& e) {
    return f->fail(e.what());
  }
  for (auto& r : plan) {
    for (auto& [id, m] : objects_) {
      if (m.slice != r.slice || m.ranks.at(r.index) != r.from_device + 1) continue;
      const int from = r.from_device + 1, to = r.to_device + 1, tag = tags::move_tag(next_move_++);
      chan_.send(from, MoveOut{id, to, tag});
      chan_.send(to, MoveIn{id, m.owner, m.spec.shard, from, tag});
      m.ranks[r.index] = to;
    }
  }
  f->set({});  // programs on the remapped slices lower again at their next run
}

void Dispatcher::free_object(uint64_t id) {
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  // An output of a run still held by a scheduler: the worker must not hear of the free before
  // the run, or the run's output would be registered after the free and never dropped.
  if (auto r = runs_.find(run_of_object(id)); r != runs_.end() && !r->second->sent) {
    r->second->early_frees.push_back(id);
    objects_.erase(it);
    return;
  }
  for (int r : it->second.ranks) frees_[r].push_back(id);
  objects_.erase(it);
}

void Dispatcher::free_owner(uint64_t owner) {
  post_staged();  // kRuns staged in this pass go before the kFreeOwner
  closed_.insert(owner);
  usage_[owner].connected = false;
  // Its lowered programs are evicted from the workers (lowered again should one run later).
  if (auto pit = programs_by_owner_.find(owner); pit != programs_by_owner_.end()) {
    for (auto& w : pit->second)
      if (auto ps = w.lock(); ps && ps->lowered) {
        evict(*ps->lowered);
        ps->lowered.reset();
      }
    programs_by_owner_.erase(pit);
  }
  for (auto it = objects_.begin(); it != objects_.end();)
    it = it->second.owner == owner ? objects_.erase(it) : std::next(it);
  for (int r : workers_) chan_.send(r, FreeOwner{owner});
}

void Dispatcher::evict(const LoweredProgram& lp) {
  post_staged();
  for (int r : lp.ranks()) chan_.send(r, EvictProgram{lp.id});
}

std::shared_ptr<LoweredProgram> Dispatcher::lowered(ProgramState& p) {
  if (p.lowered) {
    bool fresh = true;
    for (auto& [slice, gen] : p.lowered->generations) fresh = fresh && c_.rm().generation(slice) == gen;
    if (fresh) return p.lowered;
    evict(*p.lowered);
    p.lowered.reset();
  }
  SliceLookup lookup = [&](int id) {
    SliceInfo s = c_.rm().slice(id);
    return SliceMapping{s.world_ranks(), s.context, s.generation, s.island};
  };
  auto lp = std::make_shared<LoweredProgram>(lower(p.def, c_.new_id(), lookup));
  const auto devs = c_.rm().devices();
  for (auto& [r, wp] : lp->workers) {
    lp->island_execs[devs.at(r - 1).island] += static_cast<int>(wp.execs.size());
    lp->execs += static_cast<int>(wp.execs.size());
  }
  for (auto& [r, wp] : lp->workers) chan_.send(r, wp);
  p.lowered = lp;
  return lp;
}

void Dispatcher::pump_schedulers() {
  for (auto& s : scheds_) {
    while (auto id = s->next()) {
      auto it = runs_.find(*id);
      if (it != runs_.end() && --it->second->islands_pending == 0) dispatch(*it->second);
    }
  }
}

void Dispatcher::dispatch(RunRec& r) {
  if (closed_.count(r.owner)) return abandon(r);
  RunHeader h;
  h.run_id = r.id;
  h.program_id = r.lp->id;
  h.owner = r.owner;
  h.flags = (r.opts.sequential ? kRunSequential : 0) | (r.opts.deadline_s > 0 ? kRunTrace : 0) |
            (c_.opts_.island_ordering ? 0 : kRunUnordered) | (c_.opts_.trace_path.empty() ? 0 : kRunRecord) |
            (urgent(r) ? kRunAwaited : 0);
  for (auto& a : r.in) h.inputs.push_back(a->id);
  auto body = encode(h);
  for (int rank : r.waiting) {
    if (c_.opts_.island_ordering || r.opts.sequential)  // (stage releases follow the kRun)
      chan_.post(rank, MsgType::kRun, body);
    else
      staged_[rank].push_back({r.owner, body});
  }
  r.sent = true;
  sent_order_.push_back(r.id);
  predictions_dirty_ = true;
  for (uint64_t id : r.early_frees)
    for (int rank : r.lp->outputs.at(output_index_of(id)).ranks) frees_[rank].push_back(id);
  r.early_frees.clear();
  ClientUsage& u = usage_[r.owner];
  u.runs_dispatched++;
  u.node_shards += static_cast<uint64_t>(r.lp->execs);
  if (!c_.opts_.trace_path.empty() && !traced_runs_.count(r.lp->id)) {
    std::vector<std::string> kernels;
    for (auto& n : r.prog->def.nodes) kernels.push_back(n.kernel);
    traced_runs_[r.lp->id] = {r.prog->def.name, std::move(kernels)};
  }
  r.dispatched = now_s();
  if (r.opts.deadline_s > 0) r.deadline = r.dispatched + r.opts.deadline_s;
  // (its completion is predicted when the dispatcher next plans its sleep: predict())
  if (r.opts.sequential && !r.lp->stage_ranks.empty()) release_stage(r, 0);
  if (r.waiting.empty()) complete_workers(r);
}

bool Dispatcher::urgent(const RunRec& r) {
  if (r.opts.sequential || r.deadline > 0) return true;
  for (auto& a : r.out)
    if (a->awaited) return true;
  return false;
}

void Dispatcher::release_stage(RunRec& r, uint32_t s) {
  r.stage = s;
  r.stage_waiting = r.lp->stage_ranks[s];
  for (int rank : r.stage_waiting) chan_.send(rank, ReleaseStage{{r.id, s}});
}

void Dispatcher::handle(Message& m) {
  switch (m.type) {
    case MsgType::kRunDone: {
      RunDone d = decode<RunDone>(m.body);
      auto it = runs_.find(d.run_id);
      PWM_CHECK(it != runs_.end(), "run_done for unknown run {} from rank {}", d.run_id, m.peer);
      RunRec& r = *it->second;
      r.kernel_s += d.kernel_s;
      if (!d.error.empty() && r.error.empty()) r.error = std::move(d.error);
      if (urgent(r)) urgent_activity_ = true;
      r.waiting.erase(m.peer);
      // That rank's next run is now the one its fetches wait behind (recomputed only when a
      // fetch waits: an OpByOp stream's partial completions need no new predictions).
      if (!fetch_reqs_.empty()) predictions_dirty_ = true;
      if (r.waiting.empty()) complete_workers(r);
      break;
    }
    case MsgType::kStageDone: {
      urgent_activity_ = true;
      const auto [id, s] = decode<StageDone>(m.body);
      auto it = runs_.find(id);
      if (it == runs_.end()) break;
      RunRec& r = *it->second;
      if (s != r.stage) break;
      r.stage_waiting.erase(m.peer);
      if (r.stage_waiting.empty() && s + 1 < r.lp->stage_ranks.size()) release_stage(r, s + 1);
      break;
    }
    case MsgType::kNodeEvent: {
      const auto [id, node, started] = decode<NodeEvent>(m.body);
      auto it = runs_.find(id);
      if (it == runs_.end()) break;
      if (started) {
        it->second->running[{m.peer, node}] = now_s();
      } else {
        it->second->running.erase({m.peer, node});
        it->second->finished.insert({m.peer, node});
      }
      break;
    }
    case MsgType::kFetchReply: {
      urgent_activity_ = true;
      FetchReply f = decode<FetchReply>(m.body);
      auto it = fetch_reqs_.find(f.request);
      PWM_CHECK(it != fetch_reqs_.end());
      auto [rec, k, rank] = it->second;
      fetch_reqs_.erase(it);
      if (!f.error.empty() && rec->error.empty()) rec->error = std::move(f.error);
      rec->parts[k].assign(f.bytes.begin(), f.bytes.end());
      if (--rec->left == 0) finish_fetch(*rec);
      break;
    }
    case MsgType::kStatsReply: {
      urgent_activity_ = true;
      const auto [req, s] = decode<StatsReply>(m.body);
      auto& [f, v] = stats_.at(req);
      v.push_back(s);
      if (v.size() == workers_.size()) {
        std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.rank < b.rank; });
        f->set(v);
        stats_.erase(req);
      }
      break;
    }
    case MsgType::kBye: urgent_activity_ = true; break;
    case MsgType::kTrace: {
      for (const TraceRecord& t : decode<TraceRecords>(m.body).records) dev_spans_.push_back({m.peer, t});
      break;
    }
    default: PWM_THROW("controller: unexpected message {} from rank {}", msg_type_name(m.type), m.peer);
  }
}

void Dispatcher::finish_fetch(FetchRec& rec) {
  if (!rec.error.empty()) return rec.f->fail(rec.error);
  HostTensor t;
  t.spec = rec.a->spec.logical(rec.a->slice.size());
  for (auto& p : rec.parts) t.bytes.insert(t.bytes.end(), p.begin(), p.end());
  if (t.bytes.size() != t.spec.bytes())
    return rec.f->fail(fmt::format("fetch of object {}: got {} bytes, expected {}", rec.a->id, t.bytes.size(), t.spec.bytes()));
  rec.f->set(std::move(t));
}

void Dispatcher::complete_workers(RunRec& r) {
  r.workers_done = true;
  predictions_dirty_ = true;
  // The program's device time per worker (moving average of the kernels' durations the workers
  // reported, plus a few microseconds per instruction list entry), and when each of its workers
  // became free: the inputs of the completion predictions (predict()).
  const double now = now_s();
  if (r.sent && !r.lp->workers.empty()) {
    const double n = static_cast<double>(r.lp->workers.size());
    const double d = r.kernel_s / n + 1e-6 * (1 + r.lp->execs / n);
    auto [it, fresh] = exec_time_.try_emplace(r.lp->id, d);
    if (!fresh) it->second = 0.75 * it->second + 0.25 * d;
    // The completion was noticed at `now`; it happened no later, and likely near its
    // prediction when that was earlier: an early estimate only makes the dispatcher poll.
    const double done = r.predicted_done > 0 ? std::min(now, r.predicted_done) : now;
    for (auto& [rank, wp] : r.lp->workers) free_at_[rank] = std::max(free_at_[rank], done);
  }
  if (!try_complete(r.id)) {
    deferred_++;
    return;
  }
  // Runs that waited for this one's outputs, then fetches.
  for (bool progress = deferred_ > 0; progress;) {
    progress = false;
    std::vector<uint64_t> ids;
    for (auto& [rid, rr] : runs_)
      if (rr->workers_done) ids.push_back(rid);
    for (uint64_t rid : ids) {
      if (try_complete(rid)) {
        deferred_--;
        progress = true;
      }
    }
    progress = progress && deferred_ > 0;
  }
  retry_fetches();
}

bool Dispatcher::try_complete(uint64_t id) {
  auto it = runs_.find(id);
  if (it == runs_.end()) return false;
  RunRec& r = *it->second;
  if (!r.workers_done) return false;
  std::string err = r.error;
  for (size_t i = 0; i < r.in.size(); ++i) {
    if (!r.in[i]->status.done()) return false;
    if (err.empty() && r.in[i]->status.failed())
      err = fmt::format("program '{}': input {} failed: {}", r.prog->def.name, i, r.in[i]->status.error());
  }
  if (!r.expired) {
    for (auto& a : r.out) {
      if (err.empty())
        a->status.set({});
      else
        a->status.fail(err);
    }
  }
  for (int island : r.lp->islands) scheds_.at(island)->finished(r.id);
  ClientUsage& u = usage_[r.owner];
  u.runs_completed++;
  if (r.sent) u.node_shards_completed += static_cast<uint64_t>(r.lp->execs);
  u.kernel_s += r.kernel_s;
  if (!c_.opts_.trace_path.empty()) ctl_spans_.push_back({r.id, r.owner, r.prog->def.name, r.dispatched, now_s(), r.predicted_done});
  auto rec = std::move(it->second);
  runs_.erase(it);
  rec.reset();  // drops input handles (may queue frees)
  return true;
}

void Dispatcher::retry_fetches() {
  auto w = std::move(waiting_fetches_);
  waiting_fetches_.clear();
  for (auto& [a, f] : w) fetch(a, f);
}

void Dispatcher::check_deadlines() {
  const double now = now_s();
  for (auto& [id, rp] : runs_) {
    RunRec& r = *rp;
    if (r.deadline == 0 || r.expired || r.workers_done || now < r.deadline) continue;
    r.expired = true;
    std::string msg = fmt::format("run {} of program '{}' missed its deadline of {:.2f} s:", r.id, r.prog->def.name,
                                  r.opts.deadline_s);
    const auto& def = r.prog->def;
    for (int rank : r.waiting) {
      std::string where = fmt::format("device {} (world rank {})", rank - 1, rank);
      bool said = false;
      for (auto& [key, t0] : r.running) {
        if (key.first != rank) continue;
        const auto& nr = r.lp->node_ranks[key.second];
        int shard = static_cast<int>(std::find(nr.begin(), nr.end(), rank) - nr.begin());
        msg += fmt::format(" {} is stuck in {} (shard {} of {}), running for {:.2f} s;", where,
                           def.describe_node(key.second), shard, nr.size(), now - t0);
        said = true;
      }
      if (said) continue;
      for (uint32_t n = 0; n < r.lp->node_ranks.size() && !said; ++n) {
        const auto& nr = r.lp->node_ranks[n];
        if (std::find(nr.begin(), nr.end(), rank) == nr.end() || r.finished.count({rank, n})) continue;
        std::string why = r.lp->describe_wait(rank, n);
        msg += fmt::format(" {} is waiting to start {}{};", where, def.describe_node(n), why.empty() ? "" : " (" + why + ")");
        said = true;
      }
      if (!said) msg += fmt::format(" {} has not finished its transfers;", where);
    }
    msg.pop_back();
    for (auto& a : r.out) a->status.fail(msg);
  }
}

void Dispatcher::flush_frees() {
  for (auto& [r, ids] : frees_) {
    if (ids.empty()) continue;
    Free msg;
    msg.objects.swap(ids);  // (ids keeps its capacity: no allocation per pass)
    chan_.send(r, msg);
    msg.objects.clear();
    ids.swap(msg.objects);
  }
}

void Dispatcher::abandon(RunRec& r) {
  for (auto& a : r.out) a->status.fail(fmt::format("program '{}': client {} disconnected before the run was sent",
                                                   r.prog->def.name, c_.client_name(r.owner)));
  for (int island : r.lp->islands) scheds_.at(island)->finished(r.id);
  runs_.erase(r.id);
}

void Dispatcher::post_staged() {
  for (auto& [rank, runs] : staged_) {
    if (runs.empty()) continue;
    // The clients of this pass, each with its runs in submission order, starting at a client
    // that depends on the worker: as if each client had its own controller posting to the
    // devices independently.
    std::vector<uint64_t> clients;
    for (auto& [c, body] : runs)
      if (std::find(clients.begin(), clients.end(), c) == clients.end()) clients.push_back(c);
    std::sort(clients.begin(), clients.end());
    const size_t k = clients.size(), first = static_cast<size_t>(rank - 1) % k;
    for (size_t j = 0; j < k; ++j)
      for (auto& [c, body] : runs)
        if (c == clients[(first + j) % k]) chan_.post(rank, MsgType::kRun, body);
    runs.clear();
  }
}

std::vector<ClientUsage> Dispatcher::usage() const {
  std::vector<ClientUsage> v;
  std::lock_guard<std::mutex> g(c_.clients_mu_);
  for (auto& [id, rec] : c_.clients_) {
    ClientUsage u;
    if (auto it = usage_.find(id); it != usage_.end()) u = it->second;
    u.id = id;
    u.name = rec.name;
    u.weight = rec.weight;
    u.connected = !rec.closed;
    v.push_back(u);
  }
  return v;
}

namespace {
std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      o += fmt::format("\\u{:04x}", static_cast<int>(ch));
    } else {
      o += ch;
    }
  }
  return o + "\"";
}
}  // namespace

// One Chrome-JSON trace (opens in ui.perfetto.dev): process 0 is the controller, with one row
// per client showing its runs from dispatch to completion; process d+1 is device d with one row
// on which every kernel execution is a slice named after its client (so each client has one
// colour on every device, like the paper's Fig. 9). Timestamps are now_s() of each process,
// the same monotonic clock on one host (across hosts they would need an offset).
void Dispatcher::write_trace() {
  double t0 = 1e300;
  for (auto& s : ctl_spans_) t0 = std::min(t0, s.t0);
  for (auto& [r, s] : dev_spans_) t0 = std::min(t0, s.t0);
  if (t0 == 1e300) t0 = 0;
  auto us = [&](double t) { return fmt::format("{:.3f}", (t - t0) * 1e6); };
  std::map<uint64_t, std::string> names;
  {
    std::lock_guard<std::mutex> g(c_.clients_mu_);
    for (auto& [id, rec] : c_.clients_) names[id] = rec.name.empty() ? fmt::format("client {}", id) : rec.name;
  }
  auto client = [&](uint64_t id) {
    auto it = names.find(id);
    return it == names.end() ? fmt::format("client {}", id) : it->second;
  };
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"controller (rank 0)\"}}";
  for (auto& [id, n] : names)
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":{}}}}}", id,
                       json_str("runs of " + n));
  for (int r : workers_) {
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":\"device {} (rank {})\"}}}}",
                       r, r - 1, r);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"args\":{{\"sort_index\":{}}}}}", r, r);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"kernels\"}}}}", r);
  }
  for (auto& s : ctl_spans_)
    out += fmt::format(",\n{{\"ph\":\"X\",\"cat\":\"run\",\"name\":{},\"pid\":0,\"tid\":{},\"ts\":{},\"dur\":{:.3f},"
                       "\"args\":{{\"run\":{},\"client\":{},\"predicted_done_us\":{}}}}}",
                       json_str(client(s.owner)), s.owner, us(s.t0), (s.t1 - s.t0) * 1e6, s.run_id,
                       json_str(client(s.owner) + ": " + s.program), s.predicted > 0 ? us(s.predicted) : "null");
  for (auto& [r, s] : dev_spans_) {
    std::string program = "?", kernel = "?";
    if (auto it = traced_runs_.find(s.program_id); it != traced_runs_.end()) {
      program = it->second.first;
      if (s.node < it->second.second.size()) kernel = it->second.second[s.node];
    }
    out += fmt::format(",\n{{\"ph\":\"X\",\"cat\":\"node\",\"name\":{},\"pid\":{},\"tid\":0,\"ts\":{},\"dur\":{:.3f},"
                       "\"args\":{{\"client\":{},\"program\":{},\"node\":{},\"kernel\":{},\"shard\":{},\"run\":{}}}}}",
                       json_str(client(s.owner)), r, us(s.t0), (s.t1 - s.t0) * 1e6, json_str(client(s.owner)),
                       json_str(program), s.node, json_str(kernel), s.shard, s.run_id);
  }
  out += "\n]}\n";
  const std::string tmp = c_.opts_.trace_path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) PWM_THROW("pathways trace: cannot write {}: check the directory exists and is writable", tmp);
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) PWM_THROW("pathways trace: writing {} failed", tmp);
  if (std::rename(tmp.c_str(), c_.opts_.trace_path.c_str()) != 0)
    PWM_THROW("pathways trace: cannot rename {} to {}", tmp, c_.opts_.trace_path);
}

// Completion predictions: the runs on the devices, in dispatch order, each starting when it was
// sent or when the previous run on its busiest worker is predicted to end, and lasting its
// program's device time. A run of a program never completed before has no prediction (0: the
// dispatcher polls for it finely if someone waits for it).
void Dispatcher::predict() {
  if (!predictions_dirty_) return;  // they depend on the runs sent and completed only
  predictions_dirty_ = false;
  std::map<int, double> free = free_at_;
  rank_next_done_.clear();
  for (uint64_t id : sent_order_) {
    auto it = runs_.find(id);
    if (it == runs_.end() || it->second->workers_done) continue;
    RunRec& r = *it->second;
    auto est = exec_time_.find(r.lp->id);
    double start = r.dispatched;
    for (auto& [rank, wp] : r.lp->workers) start = std::max(start, free[rank]);
    const double done = est == exec_time_.end() ? 0 : start + est->second;
    r.predicted_done = done;
    for (auto& [rank, wp] : r.lp->workers) {  // the first unfinished run of each rank
      if (!r.waiting.count(rank)) continue;   // this rank's share is done: its next run counts
      const double mean = est == exec_time_.end() ? 0.0 : est->second;
      rank_next_done_.try_emplace(rank, RankNext{done, mean, mean / static_cast<double>(std::max<size_t>(1, wp.execs.size()))});
    }
    for (auto& [rank, wp] : r.lp->workers)
      if (r.waiting.count(rank)) free[rank] = done > 0 ? done : std::max(free[rank], start);
  }
  while (!sent_order_.empty()) {  // forget finished runs at the front
    auto it = runs_.find(sent_order_.front());
    if (it != runs_.end() && !it->second->workers_done) break;
    sent_order_.pop_front();
  }
}

}  // namespace pwm::pathways
