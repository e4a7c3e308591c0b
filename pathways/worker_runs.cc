// A worker's runs: admission (in arrival order, under the memory cap), and the worker as the
// host of each run's walk over its instructions (dataflow/interpreter.h: the tags, the island
// order, cancels, the trace, the answers flushed before long kernels). The state: worker_impl.h.
#include <algorithm>
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

namespace pwm::pathways::worker_detail {

// The WalkHost of one run: the worker's tags, island order, cancels read inside kernels, trace,
// flushes before long kernels, and what the controller is told.
class Worker::Host final : public dataflow::WalkHost {
 public:
  Host(Worker& w, Run& run) : w_(w), run_(run), p_(run.prog->plan.p) {}

  int tag(uint32_t xfer) override { return tags::data_tag(run_.h.xfer_base, xfer); }
  std::string where() const override { return w_.where(); }
  dataflow::SliceComms& comms() override { return w_.comms_; }
  // The island order: a gang kernel starts only as the lowest-numbered unfinished kernel here
  // (unless the run was sent with the order turned off, the deadlock demonstration).
  bool may_start(size_t i) override {
    return (run_.h.flags & kRunUnordered) || *w_.pending_execs_.begin() == run_.order[i];
  }
  // Its cancel was read inside an earlier kernel's wait (poll_in_kernel) and waits for the loop.
  std::string stopped() override {
    const auto it = w_.interrupted_.find(run_.h.run_id);
    return it == w_.interrupted_.end() ? std::string() : it->second;
  }
  void before_kernel(size_t i) override;
  void after_kernel(size_t i, double t0, double t1, const std::exception* failure) override;
  bool kernel_done(size_t i, const std::string& failed) override {
    if (!failed.empty()) w_.note_error(run_, failed);
    w_.pending_execs_.erase(run_.order[i]);  // (the island order goes on)
    return w_.long_kernel_ran_;               // back to the loop (see loop())
  }
  // A transfer's post time, for the trace (worker_trace.h: read before the isend/irecv call).
  void posted(size_t i) override {
    if (!WorkerTrace::recording(run_.h)) return;
    if (run_.posted_at.size() < p_.instrs.size()) run_.posted_at.resize(p_.instrs.size(), 0);
    run_.posted_at[i] = now_s();
  }
  void transfer_done(size_t i, uint64_t bytes) override {
    const dataflow::Instr& in = p_.instrs[i];
    if (WorkerTrace::recording(run_.h))
      w_.trace_.transfer(run_.h, in, bytes, run_.posted_at[i], in.op == dataflow::Op::kSend ? kTraceSend : kTraceRecv);
  }
  void stage_done(uint32_t stage) override {
    if (run_.h.flags & kRunSequential) w_.chan_.send(0, StageDone{run_.h.run_id, stage});
  }
  // Fatal at once (Transport::abort, no unwinding past buffers other posted receives still target).
  [[noreturn]] void bad_receive(size_t i, const std::string& what) override {
    const dataflow::Instr& in = p_.instrs[i];
    w_.t_->abort(fmt::format("pathways transfer mismatch: {} {} from world rank {}{} where {} bytes were expected "
                             "(transfer {} of run {}, program '{}'); aborting the job",
                             w_.where_on_host(), what, in.peer, w_.on_host(in.peer), in.bytes, in.xfer, run_.h.run_id,
                             p_.name));
    std::abort();  // not reached
  }

 private:
  Worker& w_;
  Run& run_;
  const dataflow::WorkerProgram& p_;
};

// Answers waiting to go out (a run_done, a fetched object) leave before a kernel that takes the
// core for long (it last ran here for >= long_kernel_s_, or has not run yet): otherwise they
// would reach the controller a whole kernel late (a fused training step's statistics would be
// answered only when the worker's queue of steps is empty; long_kernel_s_ is
// LatencyPolicy::long_kernel_us). Before short kernels they stay bundled until the end of the
// pass, except a run_done a client waits for.
void Worker::Host::before_kernel(size_t i) {
  if (run_.h.flags & kRunTrace) w_.node_event(run_, p_.execs[p_.instrs[i].exec].node, true);
  const double last_s = run_.prog->last_s[p_.instrs[i].exec];
  const bool long_kernel = last_s == 0 || last_s >= w_.long_kernel_s_;
  if (long_kernel) w_.progress_fetches();
  if (long_kernel || w_.awaited_done_) {
    w_.chan_.flush();
    w_.awaited_done_ = false;
  }
  w_.kernel_run_ = run_.h.run_id;  // (poll_in_kernel: its cancel ends the kernel's collective waits)
}

void Worker::Host::after_kernel(size_t i, double t0, double t1, const std::exception* failure) {
  const dataflow::ExecInfo& e = p_.execs[p_.instrs[i].exec];
  w_.kernel_run_ = 0;
  if (!failure) {
    w_.kernels_run_++;
    run_.prog->last_s[p_.instrs[i].exec] = t1 - t0;
    w_.long_kernel_ran_ = w_.long_kernel_ran_ || t1 - t0 >= w_.long_kernel_s_;
    run_.kernel_s += t1 - t0;
    if (WorkerTrace::recording(run_.h)) w_.trace_.kernel(run_.h, e.node, e.shard, t0, t1);
  } else if (dynamic_cast<const collectives::Interrupted*>(failure)) {  // (one line: the recovery's story here)
    fmt::print(stderr, "pathways worker: {} left kernel '{}' of program '{}' inside its collectives: {}\n",
               w_.where_on_host(), e.kernel, p_.name, failure->what());
    std::fflush(stderr);
  }
  if (run_.h.flags & kRunTrace) w_.node_event(run_, e.node, false);
}

void Worker::start_run(RunHeader h, std::shared_ptr<const LoadedProgram> prog) {
  Run run;
  run.h = std::move(h);
  if (!prog) {
    run.error = fmt::format("{}: program {} is not loaded", where(), run.h.program_id);
    runs_.push_back(std::move(run));  // no walk: reported at once
    return;
  }
  if (run.h.flags & kRunCancelled) {
    run.error = cancelled_[run.h.run_id];
    cancelled_.erase(run.h.run_id);
    runs_.push_back(std::move(run));  // no walk: reported at once
    return;
  }
  run.prog = std::move(prog);
  const dataflow::WorkerProgram& p = run.prog->plan.p;
  if (opts_.memory_cap_bytes > 0 && p.buffer_bytes() > opts_.memory_cap_bytes) {
    run.error = fmt::format("{}: program '{}' needs {} bytes of buffers, more than the memory cap of {} bytes", where(),
                            p.name, p.buffer_bytes(), opts_.memory_cap_bytes);
    run.prog = nullptr;
    runs_.push_back(std::move(run));
    return;
  }
  uint32_t released = (run.h.flags & kRunSequential) ? 0 : p.num_stages;
  if (auto er = early_release_.find(run.h.run_id); er != early_release_.end()) {
    released = std::max(released, er->second);
    early_release_.erase(er);
  }
  std::vector<ObjectPtr> slots(p.slots.size());
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
    } else if (std::find(run.h.donated.begin(), run.h.donated.end(), id) != run.h.donated.end()) {
      store_.erase(id);  // donated (RunOptions::donate): the run's now, written over once read
    }
    slots[b.slot] = obj;
  }
  // Intermediates take memory when first written, except under a memory cap, whose admission
  // reserves a run's buffers up front (every admitted run fits, whatever order they run in).
  // In order (kRunInOrder), a receive's buffer is taken only shortly before the kernels that read it.
  const dataflow::WalkPolicy policy{(run.h.flags & kRunInOrder) != 0, kInOrderRecvAhead, opts_.memory_cap_bytes == 0};
  run.walk.emplace(run.prog->plan, std::move(slots), *t_, &inter_, policy, released);
  for (auto& b : p.outputs) {
    const uint64_t oid = output_object_id(run.h.run_id, b.index);
    // Freed by the client (or its client gone) while the run waited for memory: not stored.
    if (early_freed_.erase(oid) || (run.h.flags & kRunOwnerGone)) continue;
    store_.put(oid, run.walk->slot(b.slot), run.h.owner);
  }
  run.order.assign(p.instrs.size(), 0);
  for (size_t i = 0; i < p.instrs.size(); ++i)
    if (p.instrs[i].op == dataflow::Op::kExec) {
      run.order[i] = next_order_++;
      pending_execs_.insert(run.order[i]);
    }
  runs_.push_back(std::move(run));
  peak_bytes_ = std::max(peak_bytes_, static_cast<uint64_t>(Buffer::live_bytes()));
}

void Worker::cancel_run(Run& run, const std::string& reason) {
  note_error(run, reason);
  if (!run.walk) return;
  if (opts_.on_cancel) opts_.on_cancel();
  Host host(*this, run);
  run.walk->cancel(reason, host,
                   [this](collectives::Request req, ObjectPtr buf) { t_->abandon(req, std::move(buf)); });
}

bool Worker::admit() {
  bool any = false;
  while (!queued_.empty()) {
    auto& [h, prog] = queued_.front();
    if (opts_.memory_cap_bytes > 0) {
      const uint64_t need = prog ? prog->plan.p.buffer_bytes() : 0;
      const uint64_t live = static_cast<uint64_t>(std::max<int64_t>(0, Buffer::live_bytes()));
      if (need <= opts_.memory_cap_bytes && live + need > opts_.memory_cap_bytes) break;  // wait for frees
    }
    start_run(std::move(h), std::move(prog));
    queued_.pop_front();
    any = true;
  }
  return any;
}

bool Worker::progress_run(Run& run) {
  if (!run.walk) return false;
  Host host(*this, run);
  return run.walk->progress(host);
}

}  // namespace pwm::pathways::worker_detail
