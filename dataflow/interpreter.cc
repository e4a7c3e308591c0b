#include "dataflow/interpreter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/time.h"

namespace pwm::dataflow {

Plan::Plan(WorkerProgram program) : p(std::move(program)) {
  for (const ExecInfo& e : p.execs) kernels.push_back(KernelRegistry::global().find(e.kernel));
  readers.assign(p.slots.size(), 0);
  intermediate.assign(p.slots.size(), 1);
  for (const SlotBinding& b : p.params) intermediate[b.slot] = 0;
  for (const SlotBinding& b : p.outputs) intermediate[b.slot] = 0;
  // A slot takes a prefix when it has readers and each is a kernel input declared `prefix` (a
  // send or copy of it, or a kernel not registered here, needs every byte).
  prefix.assign(p.slots.size(), 1);
  std::vector<uint8_t> read(p.slots.size(), 0);
  for (size_t x = 0; x < p.execs.size(); ++x) {
    const ExecInfo& e = p.execs[x];
    Signature sig;
    try {
      if (kernels[x]) sig = kernels[x]->signature(e.attrs, e.num_shards);
    } catch (const std::exception&) {  // (the run reports it; here: no prefix)
    }
    out_prefix.emplace_back(e.outs.size(), 0);
    for (size_t k = 0; k < e.outs.size() && k < sig.outputs.size(); ++k) out_prefix.back()[k] = sig.outputs[k].prefix;
    donor.emplace_back(e.outs.size(), -1);
    for (size_t k = 0; k < e.outs.size() && k < sig.reuse.size(); ++k) {
      const int32_t j = sig.reuse[k];
      if (j < 0 || static_cast<size_t>(j) >= e.ins.size()) continue;
      const int32_t in = e.ins[static_cast<size_t>(j)], out = e.outs[k];
      if (p.slot_writers[out] == 1 && p.slots[in].bytes() == p.slots[out].bytes() &&
          std::count(e.ins.begin(), e.ins.end(), in) == 1)
        donor.back()[k] = in;
    }
    for (size_t k = 0; k < e.ins.size(); ++k) {
      read[e.ins[k]] = 1;
      if (k >= sig.inputs.size() || !sig.inputs[k].prefix) prefix[e.ins[k]] = 0;
    }
  }
  uint32_t execs = 0;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    execs_before.push_back(execs);
    if (in.op == Op::kExec) {
      for (int32_t s : p.execs[in.exec].ins) readers[s]++;
      execs++;
    } else if (in.op == Op::kSend || in.op == Op::kCopy) {
      readers[in.slot]++;
    }
    if (in.op == Op::kSend || in.op == Op::kRecv) transfers.push_back(static_cast<uint32_t>(i));
    if (in.op == Op::kSend || in.op == Op::kCopy) prefix[in.slot] = 0;
  }
  for (size_t s = 0; s < prefix.size(); ++s) prefix[s] = prefix[s] && read[s];
  // A donor read by an instruction after its kernel (a send, a copy, a later kernel) keeps its
  // buffer; so does one another output of the same kernel already takes.
  std::vector<size_t> last(p.slots.size(), 0), at_exec(p.execs.size(), 0);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    if (in.op == Op::kExec) {
      at_exec[in.exec] = i;
      for (int32_t s : p.execs[in.exec].ins) last[s] = i;
    } else if (in.op == Op::kSend || in.op == Op::kCopy) {
      last[in.slot] = i;
    }
  }
  for (size_t x = 0; x < donor.size(); ++x)
    for (size_t k = 0; k < donor[x].size(); ++k) {
      const int32_t s = donor[x][k];
      if (s < 0) continue;
      if (last[s] != at_exec[x] || std::count(donor[x].begin(), donor[x].begin() + static_cast<long>(k), s) > 0)
        donor[x][k] = -1;
    }
}

collectives::Communicator& SliceComms::get(const ExecInfo& e) {
  auto& c = comms_[e.context];
  if (!c || c->group() != e.group)
    c = std::make_unique<collectives::Communicator>(t_, std::vector<int>(e.group.begin(), e.group.end()), e.context, o_);
  return *c;
}

Walk::Walk(const Plan& plan, std::vector<ObjectPtr> slots, collectives::Transport& t, LiveBytes* live,
           WalkPolicy policy, uint32_t released)
    : plan_(&plan), t_(&t), live_(live), policy_(policy), slots_(std::move(slots)), released_(released) {
  const WorkerProgram& p = plan.p;
  PWM_CHECK_EQ(slots_.size(), p.slots.size());
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!slots_[s]) slots_[s] = std::make_shared<Object>(p.slots[s], p.slot_writers[s], policy.lazy);
  const size_t n = p.instrs.size();
  state_.assign(n, kWaiting);
  reqs_.resize(n);
  stage_left_.assign(p.num_stages, 0);
  for (const Instr& in : p.instrs) stage_left_[in.stage]++;
  readers_left_ = plan.readers;
  counted_.assign(p.slots.size(), 0);
  left_ = n;
  while (next_exec_ < n && p.instrs[next_exec_].op != Op::kExec) next_exec_++;
}

Walk::Walk(Walk&& o) noexcept = default;

Walk::~Walk() {
  for (size_t s = 0; s < counted_.size(); ++s) uncount(s);
}

void* Walk::write_ptr(int32_t s) {
  Object& o = *slots_[s];
  if (!o.buf.allocated() && plan_->intermediate[s] && !counted_[s]) {
    counted_[s] = 1;
    live_->live += o.buf.size();
    live_->peak = std::max(live_->peak, live_->live);
  }
  return o.buf.data();
}

// An output takes its donor's buffer (Plan::donor) when the donor is good, this kernel is its
// last reader here and this walk holds the only reference to it: no store, caller or other run
// can read it again, so the kernel may write over it. (A value another holder may still read,
// a program parameter the caller keeps for instance, is never written.)
void Walk::donate(size_t exec) {
  const ExecInfo& e = plan_->p.execs[exec];
  for (size_t k = 0; k < e.outs.size(); ++k) {
    const int32_t s = plan_->donor[exec][k];
    if (s < 0) continue;
    ObjectPtr& in = slots_[s];
    Object& out = *slots_[e.outs[k]];
    if (readers_left_[s] != 1 || in.use_count() != 1 || in->state != Object::State::kReady || !in->buf.allocated() ||
        out.buf.allocated())
      continue;
    uncount(static_cast<size_t>(s));  // (its bytes are the output's now)
    out.buf.take(in->buf);
    donated_bytes_ += out.buf.size();
    if (plan_->intermediate[e.outs[k]] && !counted_[e.outs[k]]) {
      counted_[e.outs[k]] = 1;
      live_->live += out.buf.size();
      live_->peak = std::max(live_->peak, live_->live);
    }
  }
}

void Walk::uncount(size_t s) {
  if (!counted_[s]) return;
  counted_[s] = 0;
  live_->live -= slots_[s]->buf.size();
}

// After its last reader here the walk lets go of the value (freed unless a store or another run
// holds it): a value lives as long as the schedule needs it.
void Walk::read_done(int32_t s) {
  if (--readers_left_[s] > 0) return;
  uncount(static_cast<size_t>(s));
  slots_[s].reset();
}

void Walk::done(WalkHost& host, size_t i) {
  state_[i] = kDone;
  left_--;
  const WorkerProgram& p = plan_->p;
  const Instr& in = p.instrs[i];
  if (in.op == Op::kExec) {
    for (int32_t s : p.execs[in.exec].ins) read_done(s);
    execs_done_++;
    while (next_exec_ < p.instrs.size() && (p.instrs[next_exec_].op != Op::kExec || state_[next_exec_] == kDone))
      next_exec_++;
  } else if (in.op == Op::kSend || in.op == Op::kCopy) {
    read_done(in.slot);
  }
  if (--stage_left_[in.stage] == 0) host.stage_done(in.stage);
  while (first_ < state_.size() && state_[first_] == kDone) first_++;
}

// A send of one whole piece of an object whose writer declared what its readers use carries that
// prefix only (Object::used); the receiver's slot takes prefixes (Plan::prefix).
uint64_t Walk::send_bytes(const Instr& in) const {
  const Object& o = *slots_[in.slot];
  if (o.piece_bytes == 0 || in.bytes != o.piece_bytes || in.offset % o.piece_bytes != 0) return in.bytes;
  return std::min(in.bytes, o.used.at(in.offset / o.piece_bytes));
}

void Walk::post_send(WalkHost& host, size_t i) {
  const Instr& in = plan_->p.instrs[i];
  host.posted(i);
  const uint64_t bytes = send_bytes(in);
  reqs_[i] = t_->isend(static_cast<char*>(slots_[in.slot]->buf.data()) + in.offset, bytes, in.peer, host.tag(in.xfer));
  state_[i] = kPosted;
  sends_++;
  bytes_sent_ += bytes;
}

void Walk::post_recv(WalkHost& host, size_t i) {
  const Instr& in = plan_->p.instrs[i];
  host.posted(i);
  reqs_[i] = t_->irecv(static_cast<char*>(write_ptr(in.slot)) + in.offset, in.bytes, in.peer, host.tag(in.xfer));
  state_[i] = kPosted;
}

// A receive's buffer is taken when it is posted. A run that arrives while the previous one still
// runs on the device (the controller dispatches a step ahead) would take all of its receives'
// buffers beside the previous run's values: in pathways_train --replicas 2 fused, the other
// island's gradient pieces of the next step beside this step's pieces and sums (docs/results/
// memory.md, 2026-12-07 12:20). So a run posts its receives once it starts its first kernel (by
// then the previous run's values it depended on are freed), except those ahead of its first
// kernel in the list, which that kernel may be waiting for.
bool Walk::may_post_recv(size_t i) const { return started_ || plan_->execs_before[i] == 0; }

// A transfer sits in the list where its consumer is, which can be far behind kernels that are
// ready one after another (a 1F1B stage's next backward before the activation it just made; a
// replica's gradient piece, consumed by the exchange after the whole backward): the walk would
// reach it only after them. So every send whose buffer is ready is posted here (isend only hands
// the buffer over, and the receiver's tag is the transfer's: no order between transfers to
// match), and, unless the run is in order, every receive of a released stage: the transfer then
// moves while the kernels before its consumer run.
bool Walk::post_transfers(WalkHost& host) {
  bool any = false;
  const WorkerProgram& p = plan_->p;
  for (uint32_t i : plan_->transfers) {
    if (i < first_ || state_[i] != kWaiting) continue;
    const Instr& in = p.instrs[i];
    if (in.stage >= released_) break;
    if (in.op == Op::kSend && slots_[in.slot]->resolved()) {
      post_send(host, i);
      any = true;
    } else if (in.op == Op::kRecv && !policy_.in_order && may_post_recv(i)) {
      post_recv(host, i);
      any = true;
    }
  }
  return any;
}

bool Walk::step_recv(WalkHost& host, size_t i) {
  const Instr& in = plan_->p.instrs[i];
  bool any = false;
  if (state_[i] == kWaiting) {
    if (!may_post_recv(i)) return false;
    post_recv(host, i);
    any = true;
  }
  size_t got = 0;
  std::string what;
  try {
    if (!t_->test(reqs_[i], &got)) return any;
    if (got != in.bytes && !(plan_->prefix[in.slot] && got < in.bytes)) what = fmt::format("received {} bytes", got);
  } catch (const std::exception& e) {
    what = fmt::format("got a longer message ({})", e.what());
  }
  if (!what.empty()) host.bad_receive(i, what);
  slots_[in.slot]->write_done();
  host.transfer_done(i, got);
  done(host, i);
  return true;
}

bool Walk::step_send(WalkHost& host, size_t i) {
  const Instr& in = plan_->p.instrs[i];
  bool any = false;
  if (state_[i] == kWaiting) {
    if (!slots_[in.slot]->resolved()) return false;  // sent even when failed: the receiver must not wait for ever
    post_send(host, i);
    any = true;
  }
  if (!t_->test(reqs_[i], nullptr)) return any;
  host.transfer_done(i, send_bytes(in));
  done(host, i);
  return true;
}

bool Walk::step_copy(size_t i) {
  const Instr& in = plan_->p.instrs[i];
  Object& src = *slots_[in.slot];
  Object& dst = *slots_[in.slot2];
  if (!src.resolved()) return false;
  std::memcpy(static_cast<char*>(write_ptr(in.slot2)) + in.offset2, static_cast<char*>(src.buf.data()) + in.offset,
              in.bytes);
  if (src.state == Object::State::kFailed) dst.fail(src.error);
  dst.write_done();
  return true;
}

bool Walk::progress(WalkHost& host) {
  // Fast path: a run whose last instruction waits for an input still being computed (a queue of
  // OpByOp runs, each waiting for the previous one's output) is skipped in O(1).
  if (blocked_on_ && left_ == 1 && !blocked_on_->resolved()) return false;
  blocked_on_ = nullptr;
  const WorkerProgram& p = plan_->p;
  bool any = post_transfers(host);
  for (size_t i = first_; i < p.instrs.size(); ++i) {
    if (state_[i] == kDone) continue;
    const Instr& in = p.instrs[i];
    if (in.stage >= released_) break;  // stages are non-decreasing in list order
    // In order, nothing further down may move yet but sends (post_transfers): stop here.
    if (policy_.in_order && plan_->execs_before[i] > execs_done_ + policy_.recv_ahead) break;
    switch (in.op) {
      case Op::kRecv: any |= step_recv(host, i); break;
      case Op::kSend: any |= step_send(host, i); break;
      case Op::kCopy:
        if (step_copy(i)) {
          done(host, i);
          any = true;
        }
        break;
      case Op::kExec: {
        bool stop = false;
        if (try_exec(host, i, &stop)) {
          any = true;
          post_transfers(host);  // its outputs' sends leave now, not when the walk reaches them
        }
        if (stop) return true;
        break;
      }
    }
  }
  return any;
}

bool Walk::try_exec(WalkHost& host, size_t i, bool* stop) {
  const WorkerProgram& p = plan_->p;
  const ExecInfo& e = p.execs[p.instrs[i].exec];
  const KernelDef* def = plan_->kernels[p.instrs[i].exec];
  if (policy_.in_order && next_exec_ != i) return false;  // an earlier kernel first
  std::string failed;
  for (int32_t s : e.ins) {
    const Object& o = *slots_[s];
    if (!o.resolved()) {
      blocked_on_ = &o;
      return false;
    }
    if (o.state == Object::State::kFailed && failed.empty()) failed = o.error;
  }
  // A gang kernel runs even on failed inputs (its result is failed anyway): its peers on other
  // devices may have good inputs and will enter the kernel's collectives.
  const bool gang = def ? def->collectives : e.collectives;
  if (gang && !host.may_start(i)) return false;
  if (!def) failed = fmt::format("unknown kernel '{}' on {} (not registered on this rank)", e.kernel, host.where());
  // A run stopped (its cancel read inside another kernel) starts no kernel, a gang one least of
  // all (its peers are gone).
  const std::string stopped = host.stopped();
  if (!stopped.empty() && failed.empty()) failed = stopped;
  if (!started_) {  // this run's receives may be posted now (may_post_recv), ahead of the kernel
    started_ = true;
    if (!policy_.in_order) post_transfers(host);
  }
  if (def && stopped.empty() && (gang || failed.empty())) {
    std::string error = run_kernel(host, i, gang);
    if (failed.empty()) failed = std::move(error);
  }
  for (int32_t s : e.outs) {
    if (!failed.empty()) slots_[s]->fail(failed);
    slots_[s]->write_done();
  }
  if (!failed.empty() && error_.empty()) error_ = failed;
  done(host, i);
  *stop = host.kernel_done(i, failed);
  return true;
}

std::string Walk::run_kernel(WalkHost& host, size_t i, bool gang) {
  const WorkerProgram& p = plan_->p;
  const ExecInfo& e = p.execs[p.instrs[i].exec];
  std::vector<KernelContext::Buffer> ins, outs;
  for (int32_t s : e.ins) ins.push_back({slots_[s]->buf.data(), &slots_[s]->spec});
  donate(p.instrs[i].exec);
  for (int32_t s : e.outs) outs.push_back({write_ptr(s), &slots_[s]->spec});
  // The collectives the kernel starts read and write its inputs' and outputs' buffers; one it
  // leaves (Interrupted: a peer was lost) keeps them alive while MPI may still read them. (Made
  // only if the kernel starts a collective.)
  collectives::BufferOwnerScope scope([this, &e]() -> std::shared_ptr<const void> {
    auto owner = std::make_shared<std::vector<ObjectPtr>>();
    for (int32_t s : e.ins) owner->push_back(slots_[s]);
    for (int32_t s : e.outs) owner->push_back(slots_[s]);
    return owner;
  });
  host.before_kernel(i);
  const double t0 = now_s();
  try {
    KernelContext ctx(e.shard, e.num_shards, t_->rank(), e.attrs, std::move(ins), std::move(outs),
                      gang ? &host.comms().get(e) : nullptr, &e.kernel);
    plan_->kernels[p.instrs[i].exec]->fn(ctx);
    for (size_t k = 0; k < ctx.used().size(); ++k) {
      if (ctx.used()[k].piece_bytes == 0 || !plan_->out_prefix[p.instrs[i].exec][k]) continue;
      Object& o = *slots_[e.outs[k]];
      o.piece_bytes = ctx.used()[k].piece_bytes;
      o.used = ctx.used()[k].used;
    }
  } catch (const std::exception& ex) {
    host.after_kernel(i, t0, now_s(), &ex);
    return fmt::format("kernel '{}' (node {} of program '{}', shard {} of {}) failed on {}: {}", e.kernel, e.node,
                       p.name, e.shard, e.num_shards, host.where(), ex.what());
  }
  host.after_kernel(i, t0, now_s(), nullptr);
  return {};
}

void Walk::cancel(const std::string& reason, WalkHost& host,
                  const std::function<void(collectives::Request, ObjectPtr)>& abandon) {
  const WorkerProgram& p = plan_->p;
  for (size_t i = first_; i < p.instrs.size(); ++i) {
    if (state_[i] == kDone) continue;
    const Instr& in = p.instrs[i];
    // A posted receive is withdrawn (else, from a peer that never sends, it would take a later
    // run's message once the tags come round); one whose message is arriving, and a send, keep
    // their buffer until MPI is done with them.
    const bool transfer = in.op == Op::kSend || in.op == Op::kRecv;
    const bool withdrawn = state_[i] == kPosted && in.op == Op::kRecv && t_->cancel_recv(reqs_[i]);
    if (state_[i] == kPosted && transfer && !withdrawn) abandon(std::move(reqs_[i]), slots_[in.slot]);
    if (in.op == Op::kExec) host.kernel_done(i, reason);
  }
  // What it would still have written fails, so that what reads it (a fetch, another run) ends;
  // its inputs are another run's to write.
  std::vector<uint8_t> input(p.slots.size(), 0);
  for (const SlotBinding& b : p.params) input[b.slot] = 1;
  for (size_t s = 0; s < slots_.size(); ++s)
    if (const ObjectPtr& o = slots_[s]; o && !input[s] && !o->resolved()) {
      o->fail(reason);
      o->pending_writes = 0;
    }
  if (error_.empty()) error_ = reason;
  left_ = 0;
}

std::vector<size_t> Walk::pending_transfers() const {
  std::vector<size_t> v;
  for (uint32_t i : plan_->transfers)
    if (state_[i] == kPosted) v.push_back(i);
  return v;
}

}  // namespace pwm::dataflow
