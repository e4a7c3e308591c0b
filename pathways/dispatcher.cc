// The dispatcher's methods (dispatcher.h). See docs/pathways.md for the protocol.
#include "pathways/dispatcher.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/time.h"
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
      Reader r(m.body);
      hosts[m.peer - 1] = r.str();
      got++;
    }
    inbox.clear();
  }
  return hosts;
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
    check_deadlines();
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
        if (all_left) break;
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
    const double now = now_s();
    double cap_us = c_.opts_.backoff_max_us, wake_at = 0;
    for (auto& [id, r] : runs_) {
      if (r->workers_done || !urgent(*r)) continue;
      if (r->predicted_done <= now)
        cap_us = std::min(cap_us, c_.opts_.busy_backoff_max_us);
      else if (wake_at == 0 || r->predicted_done < wake_at)
        wake_at = r->predicted_done;
    }
    backoff_.set_max_us(cap_us);
    auto wait = backoff_.advance();
    bool predicted = false;
    if (wake_at > 0) {
      auto until = std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, (wake_at - now) * 1e6 - 10)));
      if (until < wait) {
        wait = until;
        predicted = true;
      }
    }
    {
      std::unique_lock<std::mutex> l(c_.mu_);
      if (c_.queue_.empty() && !c_.poked_ && wait.count() > 0) {
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
         std::vector<std::shared_ptr<ArrayState>> out, RunOptions o, uint64_t run_id) {
  auto fail = [&](const std::string& e) {
    for (auto& a : out) a->status.fail(e);
  };
  const ProgramDef& def = p->def;
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
    if (in[i]->status.failed()) return fail(fmt::format("program '{}': input {} failed: {}", def.name, i, in[i]->status.error()));
    if (!objects_.count(in[i]->id))
      return fail(fmt::format("program '{}': input {} (object {}) no longer exists", def.name, i, in[i]->id));
  }
  std::shared_ptr<LoweredProgram> lp;
  try {
    lp = lowered(*p);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  auto rec = std::make_unique<RunRec>();
  rec->id = run_id;
  rec->prog = std::move(p);
  rec->lp = lp;
  rec->in = std::move(in);
  rec->out = std::move(out);
  rec->opts = o;
  rec->owner = rec->out.empty() ? 0 : rec->out[0]->owner;
  for (size_t k = 0; k < rec->out.size(); ++k) {
    const OutputPlacement& op = lp->outputs[k];
    objects_[rec->out[k]->id] = ObjMeta{op.slice, op.spec, op.ranks, rec->owner};
  }
  for (int r : lp->ranks()) rec->waiting.insert(r);
  rec->islands_pending = static_cast<int>(lp->islands.size());
  RunRec& rr = *rec;
  runs_[run_id] = std::move(rec);
  if (rr.islands_pending == 0) return dispatch(rr);
  for (int island : lp->islands) scheds_.at(island)->submit({run_id, rr.owner, static_cast<int>(rr.prog->def.nodes.size())});
  pump_schedulers();
}

void Dispatcher::put(std::shared_ptr<ArrayState> a, std::vector<std::vector<uint8_t>> shards) {
  std::vector<int> ranks = a->slice.devices();
  for (int& r : ranks) r += 1;
  for (size_t k = 0; k < ranks.size(); ++k) {
    Writer w;
    w.put(a->id);
    w.put(a->owner);
    w.put<uint8_t>(static_cast<uint8_t>(a->spec.shard.dtype));
    w.vec(a->spec.shard.shape);
    w.bytes(shards[k].data(), shards[k].size());
    chan_.post(ranks[k], MsgType::kPut, w.take());
  }
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
    fetch_reqs_[req] = {rec, k};
    Writer w;
    w.put(req);
    w.put(a->id);
    chan_.post(m.ranks[k], MsgType::kFetch, w.take());
  }
}

void Dispatcher::stats(std::shared_ptr<FutureState<std::vector<WorkerStats>>> f) {
  uint64_t req = next_req_++;
  stats_[req] = {f, {}};
  for (int r : workers_) {
    Writer w;
    w.put(req);
    chan_.post(r, MsgType::kStats, w.take());
  }
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
      Writer out;
      out.put(id);
      out.put<int32_t>(to);
      out.put<int32_t>(tag);
      chan_.post(from, MsgType::kMoveOut, out.take());
      Writer in;
      in.put(id);
      in.put(m.owner);
      in.put<uint8_t>(static_cast<uint8_t>(m.spec.shard.dtype));
      in.vec(m.spec.shard.shape);
      in.put<int32_t>(from);
      in.put<int32_t>(tag);
      chan_.post(to, MsgType::kMoveIn, in.take());
      m.ranks[r.index] = to;
    }
  }
  f->set({});  // programs on the remapped slices lower again at their next run
}

void Dispatcher::free_object(uint64_t id) {
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  for (int r : it->second.ranks) frees_[r].push_back(id);
  objects_.erase(it);
}

void Dispatcher::free_owner(uint64_t owner) {
  for (auto it = objects_.begin(); it != objects_.end();)
    it = it->second.owner == owner ? objects_.erase(it) : std::next(it);
  for (int r : workers_) {
    Writer w;
    w.put(owner);
    chan_.post(r, MsgType::kFreeOwner, w.take());
  }
}

void Dispatcher::evict(const LoweredProgram& lp) {
  for (int r : lp.ranks()) {
    Writer w;
    w.put(lp.id);
    chan_.post(r, MsgType::kEvictProgram, w.take());
  }
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
  for (auto& [r, wp] : lp->workers) {
    Writer w;
    wp.write(w);
    chan_.post(r, MsgType::kLoadProgram, w.take());
  }
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
  RunHeader h;
  h.run_id = r.id;
  h.program_id = r.lp->id;
  h.owner = r.owner;
  h.flags = (r.opts.sequential ? kRunSequential : 0) | (r.opts.deadline_s > 0 ? kRunTrace : 0);
  for (auto& a : r.in) h.inputs.push_back(a->id);
  auto body = h.encode();
  for (int rank : r.waiting) chan_.post(rank, MsgType::kRun, body);
  r.dispatched = now_s();
  if (r.opts.deadline_s > 0) r.deadline = r.dispatched + r.opts.deadline_s;
  auto est = run_time_.find(r.lp->id);
  if (est != run_time_.end()) r.predicted_done = r.dispatched + est->second;
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
  Writer w;
  w.put(r.id);
  w.put(s);
  auto body = w.take();
  for (int rank : r.stage_waiting) chan_.post(rank, MsgType::kReleaseStage, body);
}

void Dispatcher::handle(Message& m) {
  Reader rd(m.body);
  switch (m.type) {
    case MsgType::kRunDone: {
      uint64_t id = rd.get<uint64_t>();
      std::string err = rd.str();
      auto it = runs_.find(id);
      PWM_CHECK(it != runs_.end(), "run_done for unknown run {} from rank {}", id, m.peer);
      RunRec& r = *it->second;
      if (!err.empty() && r.error.empty()) r.error = err;
      if (urgent(r)) urgent_activity_ = true;
      r.waiting.erase(m.peer);
      if (r.waiting.empty()) complete_workers(r);
      break;
    }
    case MsgType::kStageDone: {
      urgent_activity_ = true;
      uint64_t id = rd.get<uint64_t>();
      uint32_t s = rd.get<uint32_t>();
      auto it = runs_.find(id);
      if (it == runs_.end()) break;
      RunRec& r = *it->second;
      if (s != r.stage) break;
      r.stage_waiting.erase(m.peer);
      if (r.stage_waiting.empty() && s + 1 < r.lp->stage_ranks.size()) release_stage(r, s + 1);
      break;
    }
    case MsgType::kNodeEvent: {
      uint64_t id = rd.get<uint64_t>();
      uint32_t node = rd.get<uint32_t>();
      bool started = rd.get<uint8_t>() != 0;
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
      uint64_t req = rd.get<uint64_t>();
      std::string err = rd.str();
      auto it = fetch_reqs_.find(req);
      PWM_CHECK(it != fetch_reqs_.end());
      auto [rec, k] = it->second;
      fetch_reqs_.erase(it);
      if (!err.empty() && rec->error.empty()) rec->error = err;
      const uint8_t* p = rd.bytes(rd.remaining());
      rec->parts[k].assign(p, p + (m.body.size() - (p - m.body.data())));
      if (--rec->left == 0) finish_fetch(*rec);
      break;
    }
    case MsgType::kStatsReply: {
      urgent_activity_ = true;
      uint64_t req = rd.get<uint64_t>();
      auto s = rd.get<WorkerStats>();
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
  const double d = now_s() - r.dispatched;  // moving average of the program's run time
  auto [it, fresh] = run_time_.try_emplace(r.lp->id, d);
  if (!fresh) it->second = 0.75 * it->second + 0.25 * d;
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
    Writer w;
    w.vec(ids);
    chan_.post(r, MsgType::kFree, w.take());
    ids.clear();
  }
}

}  // namespace pwm::pathways
