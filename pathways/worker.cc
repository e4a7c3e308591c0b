// The worker loop. See worker.h for the contract and docs/pathways.md for the protocol.
#include "pathways/worker.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <set>

#include "collectives/communicator.h"
#include "common/env.h"
#include "common/time.h"
#include "pathways/backoff.h"
#include "pathways/liveness.h"
#include "pathways/lowering.h"
#include "pathways/messages.h"
#include "pathways/object_id.h"
#include "pathways/object_store.h"
#include "pathways/tags.h"
#include "pathways/worker_run.h"
#include "pathways/worker_trace.h"

namespace pwm::pathways {

WorkerOptions WorkerOptions::from_env() {
  WorkerOptions o;
  o.latency = LatencyPolicy::from_env();
  o.memory_cap_bytes = static_cast<uint64_t>(env_double("PWM_PW_MEMORY_CAP", 0));  // (>= 0: common/env.cc)
  o.timeout_s = env_double("PWM_COLL_TIMEOUT", o.timeout_s);
  return o;
}

namespace {

using namespace worker_detail;

class Worker {
 public:
  Worker(std::shared_ptr<collectives::Transport> t, WorkerOptions o)
      : t_(std::move(t)), chan_(*t_), rank_(t_->rank()), device_(rank_ - 1),
        backoff_(o.latency.worker_backoff_min_us, o.latency.worker_backoff_max_us, o.latency.worker_spins), opts_(o),
        long_kernel_s_(1e-6 * o.latency.long_kernel_us), live_(o.timeout_s, {0}, now_s()) {
    PWM_CHECK(rank_ != 0, "run_worker on the controller rank");
    // A kernel waiting in a collective still beats (liveness.h): the controller must not take
    // a worker waiting for a stopped peer for the stopped one.
    t_->set_wait_hook([this] {
      if (live_.due(now_s())) beat();
    });
  }
  ~Worker() { t_->set_wait_hook({}); }

  void loop() {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    chan_.listen(0);
    chan_.send(0, Hello{host, opts_.memory_cap_bytes});
    chan_.flush();
    std::vector<Message> inbox;
    while (true) {
      bool any = chan_.progress(inbox);
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
        if (it->left == 0) {
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

 private:
  std::string where() const { return fmt::format("device {} (world rank {})", device_, rank_); }
  // where() with this worker's host, for the lines that end the job.
  std::string where_on_host() const { return fmt::format("device {} (world rank {}{})", device_, rank_, on_host(rank_)); }
  std::string on_host(int rank) const {
    const std::string h = t_->host_of(rank);
    return h.empty() ? h : " on " + h;
  }

  // A heartbeat to the controller (liveness.h), sent at once.
  void beat() {
    chan_.post(0, MsgType::kHeartbeat);
    chan_.flush();
  }

  [[noreturn]] void controller_silent(double now) {
    std::string doing = "its next command";
    for (auto& run : runs_)
      if (run.prog && (run.h.flags & kRunSequential) && run.released < run.prog->p.num_stages) {
        doing = fmt::format("the release of stage {} of run {}", run.released, run.h.run_id);
        break;
      }
    t_->abort(fmt::format("pathways liveness: worker {} has heard nothing from the controller (world rank 0{}) for "
                          "{:.1f} s while waiting for {} ({} run(s) in progress, {} queued); stopped or dead; aborting "
                          "the job (timeout: --coll-timeout or PWM_COLL_TIMEOUT)",
                          where_on_host(), on_host(0), live_.silence(0, now), doing, runs_.size(), queued_.size()));
    std::abort();  // not reached (GCC does not see [[noreturn]] through the virtual call)
  }

  void handle(Message& m) {
    switch (m.type) {
      case MsgType::kLoadProgram: {
        auto lp = std::make_shared<LoadedProgram>();
        lp->p = decode<WorkerProgram>(m.body);
        for (auto& e : lp->p.execs) lp->kernels.push_back(KernelRegistry::global().find(e.kernel));
        lp->last_s.assign(lp->p.execs.size(), 0.0);
        count_reads(*lp);
        programs_[lp->p.id] = std::move(lp);
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
            run.released = std::max(run.released, stage + 1);
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
      case MsgType::kStats: {
        const uint64_t req = decode<StatsRequest>(m.body).request;
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
        s.peak_intermediate_bytes = inter_peak_;
        chan_.send(0, StatsReply{req, s});
        break;
      }
      case MsgType::kShutdown: shutdown_ = true; break;
      case MsgType::kHeartbeat: break;  // (heard: see loop())
      default: PWM_THROW("worker {}: unexpected message {}", rank_, msg_type_name(m.type));
    }
  }

  // Per slot, the instructions reading it (a run drops the slot after the last) and whether it
  // is an intermediate; per instruction, the kernels before it (kRunInOrder's receive window).
  static void count_reads(LoadedProgram& lp) {
    const WorkerProgram& p = lp.p;
    lp.readers.assign(p.slots.size(), 0);
    lp.intermediate.assign(p.slots.size(), 1);
    for (auto& b : p.params) lp.intermediate[b.slot] = 0;
    for (auto& b : p.outputs) lp.intermediate[b.slot] = 0;
    uint32_t execs = 0;
    for (const Instr& in : p.instrs) {
      lp.execs_before.push_back(execs);
      if (in.op == Op::kExec) {
        for (int32_t s : p.execs[in.exec].ins) lp.readers[s]++;
        execs++;
      } else if (in.op == Op::kSend || in.op == Op::kCopy) {
        lp.readers[in.slot]++;
      }
    }
  }

  // The slot's buffer, allocated now if it is not yet (a writer is about to write it); an
  // intermediate's bytes are counted from here until the run drops it.
  void* write_ptr(Run& run, int32_t s) {
    Object& o = *run.slots[s];
    if (!o.buf.allocated() && run.prog->intermediate[s]) {
      run.counted[s] = 1;
      inter_live_ += o.buf.size();
      inter_peak_ = std::max(inter_peak_, inter_live_);
    }
    return o.buf.data();
  }
  void uncount(Run& run, size_t s) {
    if (!run.counted[s]) return;
    run.counted[s] = 0;
    inter_live_ -= run.slots[s]->buf.size();
  }
  // One reader of slot `s` is done; after the last the run lets go of the buffer (freed unless
  // the store or another run holds it): a value lives as long as the schedule needs it.
  void read_done(Run& run, int32_t s) {
    if (--run.readers_left[s] > 0) return;
    uncount(run, static_cast<size_t>(s));
    run.slots[s].reset();
  }

  void start_run(RunHeader h, std::shared_ptr<const LoadedProgram> prog) {
    Run run;
    run.h = std::move(h);
    if (!prog) {
      run.error = fmt::format("{}: program {} is not loaded", where(), run.h.program_id);
      runs_.push_back(std::move(run));  // left == 0: reported at once
      return;
    }
    run.prog = std::move(prog);
    const WorkerProgram& p = run.prog->p;
    if (opts_.memory_cap_bytes > 0 && p.buffer_bytes() > opts_.memory_cap_bytes) {
      run.error = fmt::format("{}: program '{}' needs {} bytes of buffers, more than the memory cap of {} bytes", where(),
                              p.name, p.buffer_bytes(), opts_.memory_cap_bytes);
      run.prog = nullptr;
      runs_.push_back(std::move(run));
      return;
    }
    if (auto er = early_release_.find(run.h.run_id); er != early_release_.end()) {
      run.released = er->second;
      early_release_.erase(er);
    }
    run.slots.resize(p.slots.size());
    for (auto& b : p.params) {
      PWM_CHECK_LT(b.index, run.h.inputs.size());
      const uint64_t id = run.h.inputs[b.index];
      uint64_t owner = 0;
      ObjectPtr obj = store_.find(id, &owner);
      if (obj && owner != run.h.owner) {  // isolation (the controller checked it too)
        std::string e = fmt::format("{}: input {} (object {}) belongs to another client", where(), b.index, id);
        obj = std::make_shared<Object>(p.slots[b.slot]);
        obj->fail(e);
        if (run.error.empty()) run.error = e;
      } else if (!obj) {
        obj = std::make_shared<Object>(p.slots[b.slot]);
        obj->fail(fmt::format("{}: input {} (object {}) does not exist here (freed?)", where(), b.index, id));
        if (run.error.empty()) run.error = obj->error;
      } else if (!(obj->spec == p.slots[b.slot])) {
        std::string e = fmt::format("{}: input {} (object {}) is {}, the program expects {}", where(), b.index, id,
                                    obj->spec.str(), p.slots[b.slot].str());
        obj = std::make_shared<Object>(p.slots[b.slot]);
        obj->fail(e);
        if (run.error.empty()) run.error = e;
      }
      run.slots[b.slot] = obj;
    }
    // Intermediates take memory when first written, except under a memory cap, whose admission
    // reserves a run's buffers up front (every admitted run fits, whatever order they run in).
    const bool lazy = opts_.memory_cap_bytes == 0;
    for (size_t s = 0; s < p.slots.size(); ++s)
      if (!run.slots[s]) run.slots[s] = std::make_shared<Object>(p.slots[s], p.slot_writers[s], lazy);
    run.readers_left = run.prog->readers;
    run.counted.assign(p.slots.size(), 0);
    for (auto& b : p.outputs) {
      const uint64_t oid = output_object_id(run.h.run_id, b.index);
      // Freed by the client (or its client gone) while the run waited for memory: not stored.
      if (early_freed_.erase(oid) || (run.h.flags & kRunOwnerGone)) continue;
      store_.put(oid, run.slots[b.slot], run.h.owner);
    }
    const size_t n = p.instrs.size();
    run.state.assign(n, kWaiting);
    run.reqs.resize(n);
    run.order.assign(n, 0);
    run.stage_left.assign(p.num_stages, 0);
    for (size_t i = 0; i < n; ++i) {
      run.stage_left[p.instrs[i].stage]++;
      if (p.instrs[i].op == Op::kExec) {
        run.order[i] = next_order_++;
        pending_execs_.insert(run.order[i]);
      }
    }
    run.left = n;
    while (run.next_exec < n && p.instrs[run.next_exec].op != Op::kExec) run.next_exec++;
    if (!(run.h.flags & kRunSequential)) run.released = p.num_stages;
    runs_.push_back(std::move(run));
    peak_bytes_ = std::max(peak_bytes_, static_cast<uint64_t>(Buffer::live_bytes()));
  }

  bool queued(uint64_t run_id) const {
    for (auto& q : queued_)
      if (q.first.run_id == run_id) return true;
    return false;
  }

  // Starts queued runs in arrival order while their buffers fit under the memory cap (all of
  // them without a cap). A run that could never fit is started to fail at once.
  bool admit() {
    bool any = false;
    while (!queued_.empty()) {
      auto& [h, prog] = queued_.front();
      if (opts_.memory_cap_bytes > 0) {
        const uint64_t need = prog ? prog->p.buffer_bytes() : 0;
        const uint64_t live = static_cast<uint64_t>(std::max<int64_t>(0, Buffer::live_bytes()));
        if (need <= opts_.memory_cap_bytes && live + need > opts_.memory_cap_bytes) break;  // wait for frees
      }
      start_run(std::move(h), std::move(prog));
      queued_.pop_front();
      any = true;
    }
    return any;
  }

  // A transfer's post time, for the trace (worker_trace.h: read before the isend/irecv call).
  void note_posted(Run& run, size_t i) {
    if (!WorkerTrace::recording(run.h)) return;
    if (run.posted_at.size() < run.state.size()) run.posted_at.resize(run.state.size(), 0);
    run.posted_at[i] = now_s();
  }
  void record_transfer(Run& run, size_t i, TraceKind kind) {
    if (WorkerTrace::recording(run.h)) trace_.transfer(run.h, run.prog->p.instrs[i], run.posted_at[i], kind);
  }

  // A transfer's receive: a message of another size than the lowered program says is fatal at
  // once (Transport::abort, no unwinding past buffers other posted receives still target).
  bool test_recv(Run& run, size_t i, size_t* got) {
    const Instr& in = run.prog->p.instrs[i];
    std::string what;
    try {
      if (!t_->test(run.reqs[i], got)) return false;
      if (*got == in.bytes) return true;
      what = fmt::format("received {} bytes", *got);
    } catch (const std::exception& e) {
      what = fmt::format("got a longer message ({})", e.what());
    }
    t_->abort(fmt::format("pathways transfer mismatch: {} {} from world rank {}{} where {} bytes were expected "
                          "(transfer {} of run {}, program '{}'); aborting the job",
                          where_on_host(), what, in.peer, on_host(in.peer), in.bytes, in.xfer, run.h.run_id,
                          run.prog->p.name));
    std::abort();  // not reached
  }

  void done(Run& run, size_t i) {
    run.state[i] = kDone;
    run.left--;
    const WorkerProgram& p = run.prog->p;
    const Instr& in = p.instrs[i];
    if (in.op == Op::kExec) {
      for (int32_t s : p.execs[in.exec].ins) read_done(run, s);
      run.execs_done++;
      while (run.next_exec < p.instrs.size() &&
             (p.instrs[run.next_exec].op != Op::kExec || run.state[run.next_exec] == kDone))
        run.next_exec++;
    } else if (in.op == Op::kSend || in.op == Op::kCopy) {
      read_done(run, in.slot);
    }
    if (--run.stage_left[in.stage] == 0 && (run.h.flags & kRunSequential)) {
      chan_.send(0, StageDone{run.h.run_id, in.stage});
    }
    while (run.first < run.state.size() && run.state[run.first] == kDone) run.first++;
  }

  void note_error(Run& run, const std::string& e) {
    if (run.error.empty()) run.error = e;
  }

  bool progress_run(Run& run) {
    if (!run.prog) return false;
    // Fast path: a run whose last instruction waits for an input still being computed (a queue
    // of OpByOp runs, each waiting for the previous one's output) is skipped in O(1).
    if (run.blocked_on && run.left == 1 && !run.blocked_on->resolved()) return false;
    run.blocked_on = nullptr;
    const WorkerProgram& p = run.prog->p;
    bool any = false;
    // In order, a send can sit behind kernels that are ready one after another (a 1F1B stage's
    // next backward before the activation it just made): each long kernel ends the pass, so the
    // walk below would reach the send only after them. Post every send whose buffer is ready
    // first: isend only hands the buffer over, and the receiver's tag is the transfer's.
    if (run.h.flags & kRunInOrder)
      for (size_t i = run.first; i < p.instrs.size(); ++i) {
        const Instr& in = p.instrs[i];
        if (in.stage >= run.released) break;
        if (in.op == Op::kSend && run.state[i] == kWaiting && run.slots[in.slot]->resolved()) {
          post_send(run, i);
          any = true;
        }
      }
    for (size_t i = run.first; i < p.instrs.size(); ++i) {
      if (run.state[i] == kDone) continue;
      const Instr& in = p.instrs[i];
      if (in.stage >= run.released) break;  // stages are non-decreasing in program order
      switch (in.op) {
        case Op::kRecv: {
          Object& dst = *run.slots[in.slot];
          if (run.state[i] == kWaiting) {
            // In order: the buffer is taken only shortly before the kernels that read it.
            if ((run.h.flags & kRunInOrder) && run.prog->execs_before[i] > run.execs_done + kInOrderRecvAhead) break;
            note_posted(run, i);
            run.reqs[i] = t_->irecv(static_cast<char*>(write_ptr(run, in.slot)) + in.offset, in.bytes, in.peer,
                                    tags::data_tag(run.h.xfer_base, in.xfer));
            run.state[i] = kPosted;
            any = true;
          }
          size_t got = 0;
          if (test_recv(run, i, &got)) {
            dst.write_done();
            record_transfer(run, i, kTraceRecv);
            done(run, i);
            any = true;
          }
          break;
        }
        case Op::kSend: {
          Object& src = *run.slots[in.slot];
          if (run.state[i] == kWaiting) {
            if (!src.resolved()) break;  // sent even when failed: the receiver must not wait for ever
            post_send(run, i);
            any = true;
          }
          if (t_->test(run.reqs[i], nullptr)) {
            record_transfer(run, i, kTraceSend);
            done(run, i);
            any = true;
          }
          break;
        }
        case Op::kCopy: {
          Object& src = *run.slots[in.slot];
          Object& dst = *run.slots[in.slot2];
          if (!src.resolved()) break;
          std::memcpy(static_cast<char*>(write_ptr(run, in.slot2)) + in.offset2,
                      static_cast<char*>(src.buf.data()) + in.offset, in.bytes);
          if (src.state == Object::State::kFailed) dst.fail(src.error);
          dst.write_done();
          done(run, i);
          any = true;
          break;
        }
        case Op::kExec:
          if (try_exec(run, i)) any = true;
          if (long_kernel_ran_) return true;  // back to the loop (see loop())
          break;
      }
    }
    return any;
  }

  void post_send(Run& run, size_t i) {
    const Instr& in = run.prog->p.instrs[i];
    note_posted(run, i);
    run.reqs[i] = t_->isend(static_cast<char*>(run.slots[in.slot]->buf.data()) + in.offset, in.bytes, in.peer,
                            tags::data_tag(run.h.xfer_base, in.xfer));
    run.state[i] = kPosted;
  }

  bool try_exec(Run& run, size_t i) {
    const WorkerProgram& p = run.prog->p;
    const ExecInfo& e = p.execs[p.instrs[i].exec];
    const KernelDef* def = run.prog->kernels[p.instrs[i].exec];
    if ((run.h.flags & kRunInOrder) && run.next_exec != i) return false;  // an earlier kernel first
    std::string failed;
    for (int32_t s : e.ins) {
      const Object& o = *run.slots[s];
      if (!o.resolved()) {
        run.blocked_on = &o;
        return false;
      }
      if (o.state == Object::State::kFailed && failed.empty()) failed = o.error;
    }
    // A gang node runs even on failed inputs (its result is failed anyway): its peers on other
    // devices may have good inputs and will enter the kernel's collectives.
    const bool gang = def ? def->collectives : e.collectives;
    // The island order: a gang node starts only as the lowest-numbered unfinished node here
    // (unless the run was sent with the order turned off, the deadlock demonstration).
    if (gang && !(run.h.flags & kRunUnordered) && *pending_execs_.begin() != run.order[i]) return false;
    if (!def) failed = fmt::format("unknown kernel '{}' on {} (not registered on this rank)", e.kernel, where());
    const bool skip = !def || (!gang && !failed.empty());
    if (!skip) {
      std::vector<KernelContext::Buffer> ins, outs;
      for (int32_t s : e.ins) ins.push_back({run.slots[s]->buf.data(), &run.slots[s]->spec});
      for (int32_t s : e.outs) outs.push_back({write_ptr(run, s), &run.slots[s]->spec});
      const bool trace = run.h.flags & kRunTrace;
      if (trace) node_event(run, e.node, true);
      // Answers waiting to go out (a run_done, a fetched object) leave before a kernel that takes
      // the core for long (it last ran here for >= long_kernel_s_, or has not run yet): otherwise
      // they would reach the controller a whole kernel late (a fused training step's statistics
      // would be answered only when the worker's queue of steps is empty; long_kernel_s_ is
      // LatencyPolicy::long_kernel_us). Before short kernels they stay bundled until the end of
      // the pass, except a run_done a client waits for.
      double& last_s = run.prog->last_s[p.instrs[i].exec];
      const bool long_kernel = last_s == 0 || last_s >= long_kernel_s_;
      if (long_kernel) progress_fetches();
      if (long_kernel || awaited_done_) {
        chan_.flush();
        awaited_done_ = false;
      }
      const double t0 = now_s();
      try {
        KernelContext ctx(e.shard, e.num_shards, rank_, e.attrs, std::move(ins), std::move(outs),
                          gang ? &comm(*run.prog, p.instrs[i].exec) : nullptr, &e.kernel);
        def->fn(ctx);
        kernels_run_++;
        const double t1 = now_s();
        last_s = t1 - t0;
        long_kernel_ran_ = long_kernel_ran_ || last_s >= long_kernel_s_;
        run.kernel_s += t1 - t0;
        if (WorkerTrace::recording(run.h)) trace_.kernel(run.h, e.node, e.shard, t0, t1);
      } catch (const std::exception& ex) {
        if (failed.empty())
          failed = fmt::format("kernel '{}' ({} of program '{}', shard {} of {}) failed on {}: {}", e.kernel,
                             fmt::format("node {}", e.node), p.name, e.shard, e.num_shards, where(), ex.what());
      }
      if (trace) node_event(run, e.node, false);
    }
    for (int32_t s : e.outs) {
      if (!failed.empty()) run.slots[s]->fail(failed);
      run.slots[s]->write_done();
    }
    if (!failed.empty()) note_error(run, failed);
    pending_execs_.erase(run.order[i]);
    done(run, i);
    return true;
  }

  void node_event(Run& run, uint32_t node, bool started) {
    chan_.send(0, NodeEvent{run.h.run_id, node, started});
    chan_.flush();  // now: the controller must hear of a start while the kernel runs
  }

  // The slice communicator of exec `x`: one per (context, group) on this worker, shared by every
  // program on that slice so that its collective sequence numbers stay in step.
  collectives::Communicator& comm(const LoadedProgram& lp, int32_t x) {
    if (lp.comms.empty()) lp.comms.resize(lp.p.execs.size());
    if (auto& c = lp.comms[x]) return *c;
    const ExecInfo& e = lp.p.execs[x];
    std::vector<int> group(e.group.begin(), e.group.end());
    auto it = comms_.find(e.context);
    if (it == comms_.end() || it->second->group() != group)
      it = comms_.insert_or_assign(e.context, std::make_shared<collectives::Communicator>(t_, group, e.context)).first;
    return *(lp.comms[x] = it->second);
  }

  void finish_run(Run& run) {
    for (size_t s = 0; s < run.counted.size(); ++s) uncount(run, s);
    chan_.send(0, RunDone{run.h.run_id, std::move(run.error), run.kernel_s});  // (the run ends here)
    if (run.h.flags & kRunAwaited) awaited_done_ = true;
  }

  bool progress_moves() {
    bool any = false;
    for (auto it = moves_.begin(); it != moves_.end();) {
      Move& m = *it;
      if (!m.posted) {
        if (m.out && !m.obj->resolved()) {
          ++it;
          continue;
        }
        m.req = m.out ? t_->isend(m.obj->buf.data(), m.obj->buf.size(), m.peer, m.tag)
                      : t_->irecv(m.obj->buf.data(), m.obj->buf.size(), m.peer, m.tag);
        m.posted = true;
        any = true;
      }
      if (t_->test(m.req, nullptr)) {
        if (m.out) {
          if (store_.find(m.object) == m.obj) store_.erase(m.object);
        } else {
          m.obj->write_done();
        }
        it = moves_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    return any;
  }

  bool progress_fetches() {
    bool any = false;
    for (auto it = fetches_.begin(); it != fetches_.end();) {
      ObjectPtr obj = store_.find(it->object);
      if ((obj && !obj->resolved()) || (!obj && queued(run_of_object(it->object)))) {  // pending, or its run waits for memory
        ++it;
        continue;
      }
      FetchReply reply{it->request, "", {}};
      if (!obj)
        reply.error = fmt::format("object {} does not exist on {}", it->object, where());
      else if (obj->state == Object::State::kFailed)
        reply.error = obj->error;
      else
        reply.bytes = {static_cast<const uint8_t*>(obj->buf.data()), obj->buf.size()};
      chan_.send(0, reply);
      it = fetches_.erase(it);
      any = true;
    }
    return any;
  }

  std::shared_ptr<collectives::Transport> t_;
  Channel chan_;
  int rank_, device_;
  Backoff backoff_;
  WorkerOptions opts_;
  double last_active_ = now_s();
  bool shutdown_ = false;
  ObjectStore store_;
  std::map<uint64_t, std::shared_ptr<const LoadedProgram>> programs_;
  std::list<Run> runs_;
  std::list<Move> moves_;
  std::list<Fetch> fetches_;
  std::map<uint32_t, std::shared_ptr<collectives::Communicator>> comms_;
  std::set<uint64_t> pending_execs_;
  std::deque<std::pair<RunHeader, std::shared_ptr<const LoadedProgram>>> queued_;  // not started, arrival order
  std::set<uint64_t> early_freed_;             // outputs of queued runs already freed
  std::map<uint64_t, uint32_t> early_release_; // stage releases of queued sequential runs
  WorkerTrace trace_;
  uint64_t peak_bytes_ = 0;
  uint64_t inter_live_ = 0, inter_peak_ = 0;  // bytes of runs' intermediates (write_ptr)
  // kRunInOrder: a receive is posted when at most this many kernels before it are left.
  static constexpr uint32_t kInOrderRecvAhead = 8;
  bool awaited_done_ = false;  // a run_done of a kAwaited run is posted, not yet flushed
  bool long_kernel_ran_ = false;  // in this pass of loop()
  const double long_kernel_s_;  // LatencyPolicy::long_kernel_us, in seconds
  uint64_t next_order_ = 0;
  uint64_t kernels_run_ = 0;
  Liveness live_;  // the controller's silence; our heartbeats
};

}  // namespace

void run_worker(std::shared_ptr<collectives::Transport> transport, WorkerOptions options) {
  Worker w(transport, options);
  try {
    w.loop();
  } catch (const std::exception& e) {
    // Ended here, with the worker (its buffers, its posted receives) alive: unwinding further
    // would free buffers that MPI may still write into before the job is aborted.
    transport->abort(fmt::format("error: [rank {}] pathways worker: {}", transport->rank(), e.what()));
  }
}

}  // namespace pwm::pathways
