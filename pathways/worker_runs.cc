// A worker's runs: admission (in arrival order, under the memory cap), the walk over a run's
// instructions in its program's order, and the kernels. The state: worker_impl.h.
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

void* Worker::write_ptr(Run& run, int32_t s) {
  Object& o = *run.slots[s];
  if (!o.buf.allocated() && run.prog->intermediate[s]) {
    run.counted[s] = 1;
    inter_live_ += o.buf.size();
    inter_peak_ = std::max(inter_peak_, inter_live_);
  }
  return o.buf.data();
}

void Worker::start_run(RunHeader h, std::shared_ptr<const LoadedProgram> prog) {
  Run run;
  run.h = std::move(h);
  if (!prog) {
    run.error = fmt::format("{}: program {} is not loaded", where(), run.h.program_id);
    runs_.push_back(std::move(run));  // left == 0: reported at once
    return;
  }
  if (run.h.flags & kRunCancelled) {
    run.error = cancelled_[run.h.run_id];
    cancelled_.erase(run.h.run_id);
    runs_.push_back(std::move(run));  // left == 0: reported at once
    return;
  }
  run.prog = std::move(prog);
  const dataflow::WorkerProgram& p = run.prog->p;
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
    if (p.instrs[i].op == dataflow::Op::kExec) {
      run.order[i] = next_order_++;
      pending_execs_.insert(run.order[i]);
    }
  }
  run.left = n;
  while (run.next_exec < n && p.instrs[run.next_exec].op != dataflow::Op::kExec) run.next_exec++;
  if (!(run.h.flags & kRunSequential)) run.released = p.num_stages;
  runs_.push_back(std::move(run));
  peak_bytes_ = std::max(peak_bytes_, static_cast<uint64_t>(Buffer::live_bytes()));
}

void Worker::cancel_run(Run& run, const std::string& reason) {
  note_error(run, reason);
  if (!run.prog) return;
  if (opts_.on_cancel) opts_.on_cancel();
  const dataflow::WorkerProgram& p = run.prog->p;
  for (size_t i = run.first; i < p.instrs.size(); ++i) {
    if (run.state[i] == kDone) continue;
    const dataflow::Instr& in = p.instrs[i];
    // A posted receive is withdrawn (else, from a peer that never sends, it would take a later
    // run's message once the data tags come round); one whose message is arriving, and a send,
    // keep their buffer until MPI is done with them.
    const bool withdrawn = run.state[i] == kPosted && in.op == dataflow::Op::kRecv && t_->cancel_recv(run.reqs[i]);
    if (run.state[i] == kPosted && !withdrawn && (in.op == dataflow::Op::kSend || in.op == dataflow::Op::kRecv))
      abandoned_.push_back({std::move(run.reqs[i]), run.slots[in.slot]});
    if (in.op == dataflow::Op::kExec) pending_execs_.erase(run.order[i]);  // (the island order goes on without it)
  }
  // What it would still have written fails, so that what reads it (a fetch, another run) ends;
  // its inputs are another run's to write.
  std::vector<uint8_t> input(p.slots.size(), 0);
  for (auto& b : p.params) input[b.slot] = 1;
  for (size_t s = 0; s < run.slots.size(); ++s)
    if (const ObjectPtr& o = run.slots[s]; o && !input[s] && !o->resolved()) {
      o->fail(reason);
      o->pending_writes = 0;
    }
  run.left = 0;
}

bool Worker::progress_abandoned() {
  bool any = false;
  for (auto it = abandoned_.begin(); it != abandoned_.end();) {
    size_t got = 0;
    if (t_->test(it->req, &got)) {
      it = abandoned_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

bool Worker::admit() {
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

bool Worker::post_transfers(Run& run) {
  // A transfer sits in the list where its consumer is, which can be far behind kernels that are
  // ready one after another (a 1F1B stage's next backward before the activation it just made; a
  // replica's gradient piece, consumed by the exchange after the whole backward): the walk would
  // reach it only after them. So every send whose buffer is ready is posted here (isend only
  // hands the buffer over, and the receiver's tag is the transfer's: no order between transfers
  // to match), and, unless the run is in order (whose receives wait for their kernels: the
  // schedule bounds the buffers), every receive of a released stage: the transfer then moves
  // while the kernels before its consumer run.
  bool any = false;
  const dataflow::WorkerProgram& p = run.prog->p;
  for (uint32_t i : run.prog->transfers) {
    if (i < run.first || run.state[i] != kWaiting) continue;
    const dataflow::Instr& in = p.instrs[i];
    if (in.stage >= run.released) break;
    if (in.op == dataflow::Op::kSend && run.slots[in.slot]->resolved()) {
      post_send(run, i);
      any = true;
    } else if (in.op == dataflow::Op::kRecv && !(run.h.flags & kRunInOrder)) {
      post_recv(run, i);
      any = true;
    }
  }
  return any;
}

bool Worker::progress_run(Run& run) {
  if (!run.prog) return false;
  // Fast path: a run whose last instruction waits for an input still being computed (a queue
  // of OpByOp runs, each waiting for the previous one's output) is skipped in O(1).
  if (run.blocked_on && run.left == 1 && !run.blocked_on->resolved()) return false;
  run.blocked_on = nullptr;
  const dataflow::WorkerProgram& p = run.prog->p;
  bool any = post_transfers(run);
  for (size_t i = run.first; i < p.instrs.size(); ++i) {
    if (run.state[i] == kDone) continue;
    const dataflow::Instr& in = p.instrs[i];
    if (in.stage >= run.released) break;  // stages are non-decreasing in program order
    switch (in.op) {
      case dataflow::Op::kRecv: {
        Object& dst = *run.slots[in.slot];
        if (run.state[i] == kWaiting) {
          // In order: the buffer is taken only shortly before the kernels that read it.
          if ((run.h.flags & kRunInOrder) && run.prog->execs_before[i] > run.execs_done + kInOrderRecvAhead) break;
          post_recv(run, i);
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
      case dataflow::Op::kSend: {
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
      case dataflow::Op::kCopy: {
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
      case dataflow::Op::kExec:
        if (try_exec(run, i)) {
          any = true;
          post_transfers(run);  // its outputs' sends leave now, not when the walk reaches them
        }
        if (long_kernel_ran_) return true;  // back to the loop (see loop())
        break;
    }
  }
  return any;
}

bool Worker::try_exec(Run& run, size_t i) {
  const dataflow::WorkerProgram& p = run.prog->p;
  const dataflow::ExecInfo& e = p.execs[p.instrs[i].exec];
  const dataflow::KernelDef* def = run.prog->kernels[p.instrs[i].exec];
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
  // Its cancel was read inside an earlier kernel's wait (poll_in_kernel) and waits for the loop:
  // no kernel of it starts, a gang one least of all (its peers are gone).
  const auto cancelled = interrupted_.find(run.h.run_id);
  if (cancelled != interrupted_.end() && failed.empty()) failed = cancelled->second;
  const bool skip = !def || cancelled != interrupted_.end() || (!gang && !failed.empty());
  if (!skip) {
    std::string error = run_kernel(run, i, gang);
    if (failed.empty()) failed = std::move(error);
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

std::string Worker::run_kernel(Run& run, size_t i, bool gang) {
  const dataflow::WorkerProgram& p = run.prog->p;
  const dataflow::ExecInfo& e = p.execs[p.instrs[i].exec];
  const dataflow::KernelDef* def = run.prog->kernels[p.instrs[i].exec];
  std::string failed;
  std::vector<dataflow::KernelContext::Buffer> ins, outs;
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
  kernel_run_ = run.h.run_id;  // (poll_in_kernel: its cancel ends the kernel's collective waits)
  try {
    dataflow::KernelContext ctx(e.shard, e.num_shards, rank_, e.attrs, std::move(ins), std::move(outs),
                      gang ? &comm(*run.prog, p.instrs[i].exec) : nullptr, &e.kernel);
    def->fn(ctx);
    kernels_run_++;
    const double t1 = now_s();
    last_s = t1 - t0;
    long_kernel_ran_ = long_kernel_ran_ || last_s >= long_kernel_s_;
    run.kernel_s += t1 - t0;
    if (WorkerTrace::recording(run.h)) trace_.kernel(run.h, e.node, e.shard, t0, t1);
  } catch (const std::exception& ex) {
    failed = fmt::format("kernel '{}' ({} of program '{}', shard {} of {}) failed on {}: {}", e.kernel,
                         fmt::format("node {}", e.node), p.name, e.shard, e.num_shards, where(), ex.what());
    if (dynamic_cast<const collectives::Interrupted*>(&ex)) {  // (one line: the recovery's story on this worker)
      fmt::print(stderr, "pathways worker: {} left kernel '{}' of program '{}' inside its collectives: {}\n",
                 where_on_host(), e.kernel, p.name, ex.what());
      std::fflush(stderr);
    }
  }
  kernel_run_ = 0;
  if (trace) node_event(run, e.node, false);
  return failed;
}

collectives::Communicator& Worker::comm(const LoadedProgram& lp, int32_t x) {
  if (lp.comms.empty()) lp.comms.resize(lp.p.execs.size());
  if (auto& c = lp.comms[x]) return *c;
  const dataflow::ExecInfo& e = lp.p.execs[x];
  std::vector<int> group(e.group.begin(), e.group.end());
  auto it = comms_.find(e.context);
  if (it == comms_.end() || it->second->group() != group) {
    collectives::CommOptions o = collectives::CommOptions::from_env();
    if (opts_.collective_timeout_s > 0) o.timeout_s = opts_.collective_timeout_s;
    it = comms_.insert_or_assign(e.context, std::make_shared<collectives::Communicator>(t_, group, e.context, o)).first;
  }
  return *(lp.comms[x] = it->second);
}

}  // namespace pwm::pathways::worker_detail
