// The worker loop. See worker.h for the contract and docs/pathways_wire.md for the protocol; the
// worker's state is in worker_impl.h.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/env.h"
#include "common/time.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/object_id.h"
#include "pathways/tags.h"
#include "pathways/worker_impl.h"

namespace pwm::pathways {

WorkerOptions WorkerOptions::from_env() {
  WorkerOptions o;
  o.latency = LatencyPolicy::from_env();
  o.memory_cap_bytes = static_cast<uint64_t>(env_double("PWM_PW_MEMORY_CAP", 0));  // (>= 0: common/env.cc)
  o.timeout_s = env_double("PWM_COLL_TIMEOUT", o.timeout_s);
  return o;
}

namespace worker_detail {

void Worker::poll_in_kernel(double now) {
  if (now >= next_poll_) {
    next_poll_ = now + 1e-3;
    const size_t seen = held_.size();
    chan_.progress(held_);
    if (held_.size() > seen) live_.heard(0, now);
    for (size_t i = seen; i < held_.size(); ++i) {
      if (held_[i].type == MsgType::kEvict) evicted(decode<Evict>(held_[i].body).reason);
      if (held_[i].type != MsgType::kCancelRun) continue;
      CancelRun c = decode<CancelRun>(held_[i].body);
      interrupted_[c.run_id] = std::move(c.reason);
    }
  }
  // (Checked on every call: an abandoned collective's Work waits in its destructor, and leaves
  // the same way.)
  if (auto it = interrupted_.find(kernel_run_); it != interrupted_.end())
    throw collectives::Interrupted(fmt::format("cancelled inside its collectives: {}", it->second));
}

void Worker::loop() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  chan_.listen(0);
  chan_.send(0, Hello{host, opts_.memory_cap_bytes});
  chan_.flush();
  std::vector<Message> inbox;
  while (true) {
    inbox.swap(held_);  // (read inside a kernel's wait: poll_in_kernel; they came first)
    bool any = !inbox.empty();
    any |= chan_.progress(inbox);
    const bool heard = !inbox.empty();  // (the worker listens to the controller only)
    for (auto& m : inbox) handle(m);
    inbox.clear();
    any |= admit();
    // After a long kernel the pass ends (below): messages that came in while it ran (a fetch
    // of the result the controller just heard of) are handled before the next kernel starts.
    long_kernel_ran_ = false;
    for (auto it = runs_.begin(); it != runs_.end();) {
      any |= progress_run(*it);
      const bool stop = long_kernel_ran_;
      if (it->finished()) {
        finish_run(*it);
        it = runs_.erase(it);
        any = true;
      } else {
        ++it;
      }
      if (stop) break;
    }
    any |= progress_moves();
    any |= progress_fetches();
    if (!to_count_.empty() || !draining_.empty()) any |= progress_reclaims();
    if (const size_t kept = t_->abandoned()) any |= t_->reap_abandoned() < kept;
    any |= chan_.flush();
    if (shutdown_ && runs_.empty() && queued_.empty() && moves_.empty() && fetches_.empty()) break;
    if (any) {
      backoff_.reset();
      const double now = now_s();
      last_active_ = now;
      if (heard) live_.heard(0, now);
      if (live_.due(now)) beat();
    } else {
      const LatencyPolicy& p = opts_.latency;
      const double now = now_s();
      if (live_.due(now)) beat();
      // An idle pass found no message just now: the silence is the controller's.
      if (live_.silence(0, now) > live_.timeout_s()) controller_silent(now);
      const bool long_idle = now - last_active_ > 1e-3 * p.worker_idle_after_ms;
      backoff_.set_max_us(long_idle ? p.worker_idle_backoff_max_us : p.worker_backoff_max_us);
      backoff_.idle();
    }
  }
  if (!trace_.empty()) chan_.send(0, trace_.message());
  chan_.post(0, MsgType::kBye);
  chan_.close(0);
  const double t0 = now_s();
  while (chan_.sends_in_flight() > 0) {
    if (!chan_.progress(inbox)) backoff_.idle();
    if (now_s() - t0 > live_.timeout_s())
      t_->abort(fmt::format("pathways liveness: {} could not hand its last message (bye) to the controller (world "
                            "rank 0{}) in {:.1f} s; stopped or dead; aborting the job (timeout: --coll-timeout or "
                            "PWM_COLL_TIMEOUT)",
                            where_on_host(), on_host(0), now_s() - t0));
  }
}

void Worker::controller_silent(double now) {
  std::string doing = "its next command";
  for (auto& run : runs_)
    if (run.walk && (run.h.flags & kRunSequential) && run.walk->released() < run.prog->plan.p.num_stages) {
      doing = fmt::format("the release of stage {} of run {}", run.walk->released(), run.h.run_id);
      break;
    }
  t_->abort(fmt::format("pathways liveness: worker {} has heard nothing from the controller (world rank 0{}) for "
                        "{:.1f} s while waiting for {} ({} run(s) in progress, {} queued); stopped or dead; aborting "
                        "the job (timeout: --coll-timeout or PWM_COLL_TIMEOUT)",
                        where_on_host(), on_host(0), live_.silence(0, now), doing, runs_.size(), queued_.size()));
  std::abort();  // not reached (GCC does not see [[noreturn]] through the virtual call)
}

bool Worker::uses_block(uint32_t first) const {
  auto on_it = [&](const std::shared_ptr<const LoadedProgram>& p) {
    if (!p) return false;
    for (const dataflow::ExecInfo& e : p->plan.p.execs)
      if (e.context >= first && e.context < first + dataflow::kSliceContextStride) return true;
    return false;
  };
  for (const Run& r : runs_)
    if (on_it(r.prog)) return true;
  for (const auto& [h, prog] : queued_)
    if (on_it(prog)) return true;
  return false;
}

bool Worker::progress_reclaims() {
  bool any = false;
  for (auto it = to_count_.begin(); it != to_count_.end();) {
    if (uses_block(*it)) {
      ++it;
      continue;
    }
    // No run here uses the block, and none will (it is retired): its counts are final.
    ContextCount c{*it, {}};
    for (uint32_t k = 0; k < dataflow::kSliceContextStride; ++k) {
      const collectives::Transport::Traffic tr = t_->traffic(*it + k);
      for (size_t r = 0; r < tr.sent.size(); ++r)
        if (tr.sent[r] || tr.received[r])
          c.traffic.push_back({*it + k, static_cast<int32_t>(r), tr.sent[r], tr.received[r]});
    }
    chan_.send(0, c);
    it = to_count_.erase(it);
    any = true;
  }
  for (auto it = draining_.begin(); it != draining_.end();) {
    bool done = true;
    for (auto& d : it->second) done = d.progress() && done;
    if (!done) {
      ++it;
      continue;
    }
    comms_.forget(it->first, dataflow::kSliceContextStride);
    if (opts_.on_context_reclaimed) opts_.on_context_reclaimed(it->first, dataflow::kSliceContextStride);
    chan_.send(0, ContextDrained{it->first});
    it = draining_.erase(it);
    any = true;
  }
  return any;
}

void Worker::start_drain(const DrainContext& d) {
  if (d.give_up) {  // peers lost since the first (ignored once the block is drained here)
    if (auto it = draining_.find(d.context); it != draining_.end())
      for (auto& drain : it->second)
        for (const DrainCount& c : d.counts)
          if (c.context == drain.context()) drain.give_up(c.peer);
    return;
  }
  std::vector<collectives::ContextDrain> drains;
  for (uint32_t k = 0; k < dataflow::kSliceContextStride; ++k) {
    std::map<int, uint64_t> left;
    for (const DrainCount& c : d.counts)
      if (c.context == d.context + k) {
        PWM_CHECK(c.peer > 0 && c.peer < t_->size(), "drain_context: world rank {} out of range", c.peer);
        left[c.peer] += c.count;
      }
    drains.emplace_back(t_, d.context + k, std::move(left));
  }
  draining_[d.context] = std::move(drains);
}

WorkerStats Worker::stats() const {
  WorkerStats s;
  s.rank = rank_;
  s.objects = store_.size();
  s.buffers = static_cast<uint64_t>(Buffer::live());
  s.bytes = static_cast<uint64_t>(Buffer::live_bytes());
  s.programs = programs_.size();
  s.runs = runs_.size();
  s.kernels_run = kernels_run_;
  s.waiting_runs = queued_.size();
  s.memory_cap = opts_.memory_cap_bytes;
  s.peak_bytes = peak_bytes_;
  s.high_water_bytes = static_cast<uint64_t>(Buffer::peak_live_bytes());
  s.peak_intermediate_bytes = inter_.peak;
  return s;
}

void Worker::evicted(const std::string& why) {
  // The controller went on without this worker: its slices are elsewhere and the job's last
  // agreement leaves it out. It leaves at once, without MPI_Finalize (whose fence would wait for
  // the job) and without aborting the job that goes on without it.
  fmt::print(stderr, "pathways liveness: {} was declared lost by the controller ({}) and runs again; it leaves the "
             "job, which went on without it\n", where_on_host(), why);
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

void Worker::handle(Message& m) {
  switch (m.type) {
    case MsgType::kLoadProgram: {
      auto lp = std::make_shared<LoadedProgram>(decode<LoadProgram>(m.body));
      programs_[lp->plan.p.id] = std::move(lp);
      break;
    }
    case MsgType::kEvictProgram: programs_.erase(decode<EvictProgram>(m.body).program_id); break;
    case MsgType::kRun:
      // Runs are admitted in arrival order (which keeps the island order): with a memory
      // cap, a run waits behind the first one whose buffers do not fit yet.
      // The program is looked up now: a later evict in the same frame must not unload it.
      {
        RunHeader h = decode<RunHeader>(m.body);
        auto it = programs_.find(h.program_id);
        queued_.push_back({std::move(h), it == programs_.end() ? nullptr : it->second});
      }
      admit();
      break;
    case MsgType::kReleaseStage: {
      const auto [id, stage] = decode<ReleaseStage>(m.body);
      bool found = false;
      for (auto& run : runs_)
        if (run.h.run_id == id) {
          if (run.walk) run.walk->release(stage + 1);
          found = true;
        }
      if (!found) early_release_[id] = std::max(early_release_[id], stage + 1);  // still queued
      break;
    }
    case MsgType::kPut: {
      const PutShard p = decode<PutShard>(m.body);
      auto obj = std::make_shared<Object>(p.spec);
      if (!p.bytes.empty()) std::memcpy(obj->buf.data(), p.bytes.data(), p.bytes.size());
      store_.put(p.object, obj, p.owner);
      break;
    }
    case MsgType::kFetch: {
      fetches_.push_back(decode<Fetch>(m.body));
      break;
    }
    case MsgType::kFree:
      for (uint64_t id : decode<Free>(m.body).objects)
        if (!store_.erase(id) && queued(run_of_object(id))) early_freed_.insert(id);
      break;
    case MsgType::kFreeOwner: {
      const uint64_t owner = decode<FreeOwner>(m.body).owner;
      store_.erase_owner(owner);
      for (auto& [h, prog] : queued_)
        if (h.owner == owner) h.flags |= kRunOwnerGone;
      break;
    }
    case MsgType::kMoveOut: {
      const MoveOut o = decode<MoveOut>(m.body);
      Move mv;
      mv.out = true;
      mv.object = o.object;
      mv.peer = o.to;
      mv.tag = o.tag;
      mv.obj = store_.find(mv.object);
      if (mv.obj) moves_.push_back(std::move(mv));
      break;
    }
    case MsgType::kMoveIn: {
      const MoveIn i = decode<MoveIn>(m.body);
      Move mv;
      mv.object = i.object;
      mv.peer = i.from;
      mv.tag = i.tag;
      mv.obj = std::make_shared<Object>(i.spec, 1);
      store_.put(mv.object, mv.obj, i.owner);
      moves_.push_back(std::move(mv));
      break;
    }
    case MsgType::kStats: chan_.send(0, StatsReply{decode<StatsRequest>(m.body).request, stats()}); break;
    case MsgType::kCancelRun: {
      const CancelRun c = decode<CancelRun>(m.body);
      interrupted_.erase(c.run_id);
      for (auto it = runs_.begin(); it != runs_.end(); ++it)
        if (it->h.run_id == c.run_id) {
          cancel_run(*it, c.reason);
          finish_run(*it);
          runs_.erase(it);
          return;
        }
      for (auto& [h, prog] : queued_)
        if (h.run_id == c.run_id) {
          h.flags |= kRunCancelled;
          cancelled_[h.run_id] = c.reason;
        }
      break;  // (not found: the run ended here before the cancel came)
    }
    case MsgType::kCountContext: to_count_.insert(decode<CountContext>(m.body).context); break;
    case MsgType::kDrainContext: start_drain(decode<DrainContext>(m.body)); break;
    case MsgType::kShutdown:
      for (uint64_t r : decode<Shutdown>(m.body).lost) lost_.push_back(static_cast<int>(r));
      shutdown_ = true;
      break;
    case MsgType::kEvict: evicted(decode<Evict>(m.body).reason); break;
    case MsgType::kHeartbeat: break;  // (heard: see loop())
    default: PWM_THROW("worker {}: unexpected message {}", rank_, msg_type_name(m.type));
  }
}

}  // namespace worker_detail

void run_worker(std::shared_ptr<collectives::Transport> transport, WorkerOptions options, std::vector<int>* lost) {
  worker_detail::Worker w(transport, options);
  try {
    w.loop();
    if (lost) *lost = w.lost();
  } catch (const std::exception& e) {
    // Ended here, with the worker (its buffers, its posted receives) alive: unwinding further
    // would free buffers that MPI may still write into before the job is aborted.
    transport->abort(fmt::format("error: [rank {}] pathways worker: {}", transport->rank(), e.what()));
  }
}

}  // namespace pwm::pathways
