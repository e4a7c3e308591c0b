// The dispatcher's methods (dispatcher.h). See docs/pathways_wire.md for the protocol.
#include "pathways/dispatcher.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <unistd.h>

#include "common/time.h"
#include "pathways/object_id.h"
#include "pathways/tags.h"

namespace pwm::pathways {

namespace {
std::vector<int> worker_ranks(int world) {
  std::vector<int> w;
  for (int r = 1; r < world; ++r) w.push_back(r);
  return w;
}
}  // namespace

Dispatcher::Dispatcher(Controller& c, collectives::Transport& t, Doorbell& bell)
    : c_(c), opts_(c.options()), t_(t), chan_(t), bell_(bell),
      backoff_(opts_.latency.backoff_min_us, opts_.latency.backoff_max_us), workers_(worker_ranks(t.size())),
      live_(opts_.timeout_s, workers_, now_s()), trace_(opts_.trace_path) {}

uint64_t Dispatcher::min_memory_cap() const {
  uint64_t m = 0;
  for (auto& [r, c] : caps_)
    if (c > 0 && (m == 0 || c < m)) m = c;
  return m;
}

void Dispatcher::init_schedulers(int islands) {
  for (int i = 0; i < islands; ++i)
    scheds_.push_back(opts_.scheduler ? opts_.scheduler(i) : std::make_unique<FifoScheduler>());
}

void Dispatcher::loop() {
  std::vector<Message> inbox;
  std::vector<Doorbell::Command> cmds;
  while (true) {
    bell_.take(cmds);
    bool any = !cmds.empty();
    const bool cmds_empty = cmds.empty();
    for (auto& cmd : cmds) cmd(*this);
    cmds.clear();  // may drop handles, which queue frees: outside the doorbell's lock
    any |= chan_.progress(inbox);
    const double now = now_s();
    for (auto& m : inbox) {
      live_.heard(m.peer, now);
      handle(m);
    }
    inbox.clear();
    start_reclaims();   // (blocks retired by this pass's commands or answers)
    pump_schedulers();  // completions may have opened a window
    check_deadlines(now);
    if (live_.due(now)) check_liveness(now);  // (due() is true every quarter of the timeout)
    post_staged();
    objects_.flush_frees(chan_);
    any |= chan_.flush();
    if (stopping_ && shutdown_step(any)) break;
    if (any) {
      // Drain everything now, but only a client's command or an answer someone waits for
      // restarts the fine polling; completions nobody waits for keep the back-off where it is.
      if (!cmds_empty || urgent_activity_) backoff_.reset();
      urgent_activity_ = false;
      continue;
    }
    sleep();
  }
}

bool Dispatcher::shutdown_step(bool& any) {
  if (!shutdown_sent_ && runs_.empty() && fetch_reqs_.empty() && stats_.empty()) {
    for (int r : workers_) {
      chan_.send(r, Shutdown{{lost_.begin(), lost_.end()}});
      chan_.close(r);
    }
    shutdown_sent_ = true;
    any = true;
  }
  if (!shutdown_sent_ || chan_.sends_in_flight() > 0) return false;
  for (int r : workers_)
    if (chan_.listening(r)) return false;
  if (trace_.enabled()) {
    std::map<uint64_t, std::string> names;
    for (auto& [id, rec] : c_.clients()) names[id] = rec.name.empty() ? fmt::format("client {}", id) : rec.name;
    trace_.write(names, workers_);
  }
  return true;
}

// The sleep planner's inputs are gathered here, in one walk over the runs and the fetches in
// flight (no lookups: the predictions carry each run's mean), then the planned wait is taken on
// the doorbell, which a client's command or wait can cut short.
void Dispatcher::sleep() {
  const double now = now_s();
  predictor_.predict(runs_);
  double busy_until = 0;
  awaited_scratch_.clear();
  for (auto& [id, r] : runs_) {
    if (r->workers_done) continue;
    if (r->sent) busy_until = std::max(busy_until, r->predicted_done);
    if (r->awaited()) awaited_scratch_.push_back({r->predicted_done, r->mean_s});
  }
  fetch_scratch_.clear();
  for (auto& [req, f] : fetch_reqs_) {
    const CompletionPredictor::Next* n = predictor_.next_on(f.rank);
    fetch_scratch_.push_back(n ? PendingFetch{true, n->done, n->mean, n->kernel} : PendingFetch{});
  }
  bool held = false;
  for (auto& sch : scheds_) held = held || sch->held() > 0;
  const SleepPlan plan = plan_sleep({awaited_scratch_, fetch_scratch_, busy_until, held}, now, opts_.latency, plan_scratch_);
  backoff_.set_max_us(plan.poll_cap_us);
  const SleepPlan::Wait w = plan.wait(backoff_.advance(), now, opts_.latency);
  bell_.sleep(w.duration, now, busy_until);
  if (w.predicted) backoff_.reset();
}

void Dispatcher::run(std::shared_ptr<ProgramState> p, std::vector<std::shared_ptr<ArrayState>> in,
         std::vector<std::shared_ptr<ArrayState>> out, RunOptions o, uint64_t run_id, uint64_t owner, double weight) {
  auto fail = [&](const std::string& e) {
    for (auto& a : out) a->status.fail(e);
  };
  const dataflow::ProgramDef& def = p->def;
  if (closed_.count(owner))
    return fail(fmt::format("program '{}': client {} is disconnected", def.name, c_.client_name(owner)));
  if (!def.error.empty()) return fail(def.error);
  if (in.size() != def.params.size())
    return fail(fmt::format("program '{}' takes {} input(s), got {}", def.name, def.params.size(), in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const dataflow::ParamDef& pd = def.params[i];
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
    const ObjMeta* meta = objects_.find(in[i]->id);
    if (!meta) return fail(fmt::format("program '{}': input {} (object {}) no longer exists", def.name, i, in[i]->id));
    if (const int l = lost_of(meta->ranks); l >= 0)
      return fail(fmt::format("program '{}': input {} (object {}) was on {}", def.name, i, in[i]->id, lost_line(l)));
  }
  std::shared_ptr<dataflow::LoweredProgram> lp;
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
    const dataflow::OutputPlacement& op = lp->outputs[k];
    objects_.add(rec->out[k]->id, ObjMeta{op.slice, op.spec, op.ranks, rec->owner});
  }
  for (int r : lp->ranks()) rec->waiting.insert(r);
  rec->islands_pending = static_cast<int>(lp->islands.size());
  RunRec& rr = runs_.add(std::move(rec));
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
  usage_[a->owner].puts++;
  for (size_t k = 0; k < ranks.size(); ++k)
    chan_.send(ranks[k], PutShard{a->id, a->owner, a->spec.shard, shards[k]});
  objects_.add(a->id, ObjMeta{a->slice.id(), a->spec, ranks, a->owner});
  a->status.set({});
}

void Dispatcher::fetch(std::shared_ptr<ArrayState> a, std::shared_ptr<FutureState<HostTensor>> f) {
  if (!a->status.done()) {
    waiting_fetches_.push_back({a, f});
    return;
  }
  if (a->status.failed()) return f->fail(a->status.error());
  usage_[a->owner].fetches++;
  const ObjMeta* mp = objects_.find(a->id);
  if (!mp) return f->fail(fmt::format("object {} no longer exists", a->id));
  const ObjMeta& m = *mp;
  if (const int l = lost_of(m.ranks); l >= 0) return f->fail(fmt::format("object {} was on {}", a->id, lost_line(l)));
  const bool split = m.spec.sharding == dataflow::Sharding::kSplit;
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
  objects_.flush_frees(chan_);  // frees queued before the request are counted by it
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
  objects_.migrate(plan, chan_);
  f->set({});  // programs on the remapped slices lower again at their next run
}

void Dispatcher::free_object(uint64_t id) {
  if (!objects_.contains(id)) return;
  // An output of a run still held by a scheduler: the worker must not hear of the free before
  // the run, or the run's output would be registered after the free and never dropped.
  if (RunRec* r = runs_.find(run_of_object(id)); r && !r->sent) {
    r->early_frees.push_back(id);
    objects_.forget(id);
    return;
  }
  objects_.free(id);
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
  objects_.forget_owner(owner);
  for (int r : workers_) chan_.send(r, FreeOwner{owner});
}

void Dispatcher::evict(const dataflow::LoweredProgram& lp) {
  post_staged();
  for (int r : lp.ranks()) chan_.send(r, EvictProgram{lp.id});
}

std::shared_ptr<dataflow::LoweredProgram> Dispatcher::lowered(ProgramState& p) {
  if (p.lowered) {
    bool fresh = true;
    for (auto& [slice, gen] : p.lowered->generations) fresh = fresh && c_.rm().generation(slice) == gen;
    if (fresh) return p.lowered;
    evict(*p.lowered);
    p.lowered.reset();
  }
  dataflow::SliceLookup lookup = [&](int id) {
    SliceInfo s = c_.rm().slice(id);
    return dataflow::SliceMapping{s.world_ranks(), s.context, s.generation, s.island};
  };
  auto lp = std::make_shared<dataflow::LoweredProgram>(dataflow::lower(p.def, c_.new_id(), lookup));
  const auto devs = c_.rm().devices();
  for (auto& [r, wp] : lp->workers) {
    lp->island_execs[devs.at(r - 1).island] += static_cast<int>(wp.execs.size());
    lp->execs += static_cast<int>(wp.execs.size());
  }
  for (auto& [r, wp] : lp->workers) chan_.send(r, LoadProgram{wp});
  p.lowered = lp;
  return lp;
}

void Dispatcher::pump_schedulers() {
  for (auto& s : scheds_) {
    while (auto id = s->next()) {
      RunRec* r = runs_.find(*id);
      if (r && --r->islands_pending == 0) dispatch(*r);
    }
  }
}

void Dispatcher::dispatch(RunRec& r) {
  if (closed_.count(r.owner))
    return abandon(r, fmt::format("program '{}': client {} disconnected before the run was sent", r.prog->def.name,
                                  c_.client_name(r.owner)));
  if (const int l = lost_of(r.waiting); l >= 0)  // (lowered before the loss)
    return abandon(r, fmt::format("program '{}': {} before the run was sent", r.prog->def.name, lost_line(l)));
  if (auto it = stale_.find(r.id); it != stale_.end()) {  // (lowered for a context renewed since: cancel_runs_of)
    const std::string why = std::move(it->second);
    stale_.erase(it);
    return abandon(r, why);
  }
  RunHeader h;
  h.run_id = r.id;
  h.program_id = r.lp->id;
  h.owner = r.owner;
  h.xfer_base = next_xfer_base_;
  next_xfer_base_ = (next_xfer_base_ + std::max<uint32_t>(r.lp->transfers, 1)) % tags::kDataTags;
  h.flags = (r.opts.sequential ? kRunSequential : 0) | (r.opts.deadline_s > 0 ? kRunTrace : 0) |
            (opts_.island_ordering ? 0 : kRunUnordered) | (trace_.enabled() ? kRunRecord : 0) |
            (r.awaited() ? kRunAwaited : 0) | (r.opts.in_order ? kRunInOrder : 0);
  for (size_t i = 0; i < r.in.size(); ++i) {
    h.inputs.push_back(r.in[i]->id);
    if (i < r.opts.donate.size() && r.opts.donate[i]) h.donated.push_back(r.in[i]->id);
  }
  auto body = encode(h);
  for (int rank : r.waiting) {
    if (opts_.island_ordering || r.opts.sequential)  // (stage releases follow the kRun)
      chan_.post(rank, MsgType::kRun, body);
    else
      staged_[rank].push_back({r.owner, body});
  }
  r.sent = true;
  runs_.sent(r);
  predictor_.invalidate();
  for (uint64_t id : r.early_frees)
    for (int rank : r.lp->outputs.at(output_index_of(id)).ranks) objects_.queue_free(rank, id);
  r.early_frees.clear();
  ClientUsage& u = usage_[r.owner];
  u.runs_dispatched++;
  u.node_shards += static_cast<uint64_t>(r.lp->execs);
  trace_.program(r.lp->id, r.prog->def);
  r.dispatched = now_s();
  if (r.opts.deadline_s > 0) r.deadline = r.dispatched + r.opts.deadline_s;
  // (its completion is predicted when the dispatcher next plans its sleep)
  if (r.opts.sequential && !r.lp->stage_ranks.empty()) release_stage(r, 0);
  if (r.waiting.empty()) complete_workers(r);
}

void Dispatcher::release_stage(RunRec& r, uint32_t s) {
  r.stage = s;
  r.stage_waiting = r.lp->stage_ranks[s];
  for (int rank : r.stage_waiting) chan_.send(rank, ReleaseStage{r.id, s});
}

void Dispatcher::handle(Message& m) {
  switch (m.type) {
    case MsgType::kRunDone: {
      RunDone d = decode<RunDone>(m.body);
      RunRec* rp = runs_.find(d.run_id);
      PWM_CHECK(rp, "run_done for unknown run {} from rank {}", d.run_id, m.peer);
      RunRec& r = *rp;
      r.kernel_s += d.kernel_s;
      if (!d.error.empty() && r.error.empty()) r.error = std::move(d.error);
      if (r.awaited()) urgent_activity_ = true;
      r.waiting.erase(m.peer);
      // That rank's next run is now the one its fetches wait behind (recomputed only when a
      // fetch waits: an OpByOp stream's partial completions need no new predictions).
      if (!fetch_reqs_.empty()) predictor_.invalidate();
      if (r.waiting.empty()) complete_workers(r);
      break;
    }
    case MsgType::kStageDone: {
      urgent_activity_ = true;
      const auto [id, s] = decode<StageDone>(m.body);
      RunRec* r = runs_.find(id);
      if (!r || s != r->stage) break;
      r->stage_waiting.erase(m.peer);
      if (r->stage_waiting.empty() && s + 1 < r->lp->stage_ranks.size()) release_stage(*r, s + 1);
      break;
    }
    case MsgType::kNodeEvent: {
      const auto [id, node, started] = decode<NodeEvent>(m.body);
      RunRec* r = runs_.find(id);
      if (!r) break;
      if (started) {
        r->running[{m.peer, node}] = now_s();
      } else {
        r->running.erase({m.peer, node});
        r->finished.insert({m.peer, node});
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
    case MsgType::kContextCount:
    case MsgType::kContextDrained: reclaim_answer(m); break;
    case MsgType::kBye: urgent_activity_ = true; break;
    case MsgType::kHeartbeat: break;  // (heard: see loop())
    case MsgType::kTrace: {
      trace_.device(m.peer, decode<TraceRecords>(m.body).records,
                    1e-6 * static_cast<double>(chan_.transport().clock_offset_us(m.peer)),
                    1e-6 * static_cast<double>(chan_.transport().clock_error_us(m.peer)));
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
  predictor_.completed(r, now_s());  // the program's device time and its workers' free times
  if (!try_complete(r.id)) {
    runs_.deferred++;
    return;
  }
  // Runs that waited for this one's outputs, then fetches.
  for (bool progress = runs_.deferred > 0; progress;) {
    progress = false;
    std::vector<uint64_t> ids;
    for (auto& [rid, rr] : runs_)
      if (rr->workers_done) ids.push_back(rid);
    for (uint64_t rid : ids) {
      if (try_complete(rid)) {
        runs_.deferred--;
        progress = true;
      }
    }
    progress = progress && runs_.deferred > 0;
  }
  retry_fetches();
}

bool Dispatcher::try_complete(uint64_t id) {
  RunRec* rp = runs_.find(id);
  if (!rp) return false;
  RunRec& r = *rp;
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
  if (trace_.enabled()) trace_.run(r.id, r.owner, r.prog->def.name, r.dispatched, now_s(), r.predicted_done);
  runs_.remove(id).reset();  // drops input handles (may queue frees)
  return true;
}

void Dispatcher::retry_fetches() {
  auto w = std::move(waiting_fetches_);
  waiting_fetches_.clear();
  for (auto& [a, f] : w) fetch(a, f);
}

void Dispatcher::check_deadlines(double now) {
  for (auto& [id, rp] : runs_) {
    RunRec& r = *rp;
    if (r.deadline == 0 || r.expired || r.workers_done || now < r.deadline) continue;
    r.expired = true;
    const std::string msg = r.missed_deadline(now);
    for (auto& a : r.out) a->status.fail(msg);
  }
}

void Dispatcher::abandon(RunRec& r, const std::string& why) {
  for (auto& a : r.out) a->status.fail(why);
  for (int island : r.lp->islands) scheds_.at(island)->finished(r.id);
  runs_.remove(r.id).reset();
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
  for (auto& [id, rec] : c_.clients()) {
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

}  // namespace pwm::pathways
