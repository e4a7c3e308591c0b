#include "static_mpmd/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/time.h"
#include "dataflow/kernel.h"

namespace pwm::static_mpmd {

using dataflow::Instr;
using dataflow::Op;

// A send or receive in flight, and what to say if it never completes.
struct Executor::Pending {
  collectives::Request req;
  uint32_t node;
  int peer;
  uint64_t bytes;
  BufferPtr keep;  // the transfer's buffer, alive until it completes
  bool done = false;
};

Executor::Executor(std::shared_ptr<collectives::Transport> transport, double timeout_s, int channel)
    : t_(std::move(transport)), timeout_s_(timeout_s), channel_(channel) {
  PWM_CHECK(channel_ >= collectives::kFirstFreeChannel && channel_ + 1 < collectives::kChannels,
            "the static model's tag channels {} and {} are not free channels", channel_, channel_ + 1);
}

Executor::~Executor() = default;

// Two channels hold 16 runs' worth of transfers: a tag comes back after 16 runs, long after
// every message of the run that used it was matched (a run ends with its sends and receives done).
int Executor::tag(uint32_t xfer) const {
  constexpr uint64_t kWindows = (uint64_t{2} << collectives::kWireTagBits) / dataflow::kMaxTransfersPerProgram;
  const uint64_t t = (runs_ % kWindows) * dataflow::kMaxTransfersPerProgram + xfer;
  return collectives::logical_tag(channel_ + static_cast<int>(t >> collectives::kWireTagBits),
                                  static_cast<int>(t % collectives::kWireTagLimit));
}

collectives::Communicator& Executor::comm(const dataflow::ExecInfo& e) {
  auto& c = comms_[e.context];
  if (!c || c->group() != e.group)
    c = std::make_unique<collectives::Communicator>(t_, std::vector<int>(e.group.begin(), e.group.end()), e.context);
  return *c;
}

void Executor::wait_all(std::vector<Pending>& reqs, const dataflow::WorkerProgram& p, uint32_t node, RunStats* stats) {
  const double t0 = now_s();
  for (;;) {
    bool all = true;
    for (Pending& r : reqs) {
      if (r.done) continue;
      size_t got = 0;
      r.done = t_->test(r.req, &got);
      all = all && r.done;
    }
    if (all) break;
    if (now_s() - t0 > timeout_s_) {
      for (const Pending& r : reqs)
        if (!r.done)
          PWM_THROW("static_mpmd: rank {} waited {:.0f} s for {} bytes of program '{}' (node {}) from or to rank {} "
                    "before node {}: that rank is gone or stuck (--coll-timeout sets the wait)",
                    t_->rank(), timeout_s_, r.bytes, p.name, r.node, r.peer, node);
    }
    t_->idle();
  }
  if (stats) stats->recv_wait_s += now_s() - t0;
  reqs.erase(std::remove_if(reqs.begin(), reqs.end(), [](const Pending& r) { return r.done; }), reqs.end());
}

namespace {

// What a run does besides walking the list, worked out from the list once per run: after which
// instruction each send can go (right after the instruction that writes its source: the value
// exists, so the message leaves then, not when the walk reaches the consumer's position in the
// global order, which on a pipeline stage can be a whole kernel later), and after which
// instruction each slot is no longer needed.
struct Plan {
  std::vector<std::vector<size_t>> sends_after;  // per instruction, the sends it releases
  std::vector<size_t> sends_first;               // sends of parameters: at the start
  std::vector<char> late;                        // per instruction: a send posted where it stands
  std::vector<std::vector<int32_t>> frees;       // per instruction, the slots last used by it
  std::vector<char> intermediate;                // per slot: bound to neither a parameter nor an output
};

Plan plan_of(const dataflow::WorkerProgram& p) {
  Plan pl;
  const size_t n = p.instrs.size();
  pl.sends_after.resize(n);
  pl.late.assign(n, 0);
  pl.frees.resize(n);
  pl.intermediate.assign(p.slots.size(), 1);
  std::vector<int64_t> writer(p.slots.size(), -1), last(p.slots.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = p.instrs[i];
    const auto use = [&](int32_t s) {
      if (s >= 0) last[static_cast<size_t>(s)] = static_cast<int64_t>(i);
    };
    if (in.op == Op::kExec) {
      const dataflow::ExecInfo& e = p.execs.at(static_cast<size_t>(in.exec));
      for (int32_t s : e.ins) use(s);
      for (int32_t s : e.outs) use(s), writer[s] = static_cast<int64_t>(i);
    } else {
      use(in.slot);
      use(in.slot2);
      if (in.op == Op::kRecv) writer[in.slot] = static_cast<int64_t>(i);
      if (in.op == Op::kCopy) writer[in.slot2] = static_cast<int64_t>(i);
    }
    if (in.op != Op::kSend) continue;
    const int64_t w = writer[in.slot];
    if (w < 0) pl.sends_first.push_back(i);
    else if (p.instrs[static_cast<size_t>(w)].op == Op::kRecv) pl.late[i] = 1;  // (after that receive completes)
    else pl.sends_after[static_cast<size_t>(w)].push_back(i);
  }
  for (const auto& b : p.params) pl.intermediate[b.slot] = 0, last[b.slot] = -1;
  for (const auto& b : p.outputs) pl.intermediate[b.slot] = 0, last[b.slot] = -1;
  for (size_t s = 0; s < last.size(); ++s)
    if (last[s] >= 0) pl.frees[static_cast<size_t>(last[s])].push_back(static_cast<int32_t>(s));
  return pl;
}

}  // namespace

// One run's state on this rank.
struct Executor::Run {
  const dataflow::WorkerProgram& p;
  RunStats* stats;
  Plan plan;
  std::vector<BufferPtr> slots;
  std::vector<Pending> recvs, sends;
  std::vector<char> counted;  // per slot: its bytes are in `live`
  uint64_t live = 0, peak = 0;

  uint8_t* at(int32_t slot, uint64_t offset) { return static_cast<uint8_t*>(slots[slot]->data()) + offset; }
  // After instruction i: count the intermediates it allocated, then drop the slots it used last.
  void account(size_t i) {
    for (size_t s = 0; s < slots.size(); ++s)  // (cheap next to a kernel: tens of slots per rank)
      if (plan.intermediate[s] && !counted[s] && slots[s] && slots[s]->allocated()) {
        live += slots[s]->size();
        counted[s] = 1;
      }
    peak = std::max(peak, live);
    for (int32_t s : plan.frees[i]) {
      if (counted[s]) live -= slots[s]->size();
      slots[s].reset();  // (a transfer in flight keeps its own reference)
    }
  }
};

void Executor::progress(std::vector<Pending>& reqs) {
  for (Pending& q : reqs) {
    size_t got = 0;
    q.done = q.done || t_->test(q.req, &got);
  }
  reqs.erase(std::remove_if(reqs.begin(), reqs.end(), [](const Pending& q) { return q.done; }), reqs.end());
}

void Executor::post_send(Run& r, size_t i) {
  const Instr& in = r.p.instrs[i];
  r.sends.push_back({t_->isend(r.at(in.slot, in.offset), in.bytes, in.peer, tag(in.xfer)), in.stage, in.peer, in.bytes,
                     r.slots[in.slot]});
  if (r.stats) {
    r.stats->messages++;
    r.stats->bytes_sent += in.bytes;
  }
}

void Executor::exec(Run& r, const Instr& in) {
  const dataflow::ExecInfo& e = r.p.execs.at(static_cast<size_t>(in.exec));
  const dataflow::KernelDef* def = dataflow::KernelRegistry::global().find(e.kernel);
  if (!def) PWM_THROW("static_mpmd: kernel '{}' of program '{}' is not registered on rank {}", e.kernel, r.p.name, t_->rank());
  std::vector<dataflow::KernelContext::Buffer> ins, outs;
  for (int32_t s : e.ins) ins.push_back({r.slots[s]->data(), &r.p.slots[s]});
  for (int32_t s : e.outs) outs.push_back({r.slots[s]->data(), &r.p.slots[s]});
  const double t0 = now_s();
  try {
    dataflow::KernelContext ctx(e.shard, e.num_shards, t_->rank(), e.attrs, std::move(ins), std::move(outs),
                                e.collectives ? &comm(e) : nullptr, &e.kernel);
    def->fn(ctx);
  } catch (const std::exception& ex) {
    PWM_THROW("static_mpmd: kernel '{}' (node {} of program '{}', shard {} of {}) failed on rank {}: {}", e.kernel, e.node,
              r.p.name, e.shard, e.num_shards, t_->rank(), ex.what());
  }
  if (r.stats) r.stats->kernel_s += now_s() - t0;
}

Shards Executor::run(const dataflow::WorkerProgram& p, const Shards& inputs, RunStats* stats) {
  Run r{p, stats, plan_of(p), std::vector<BufferPtr>(p.slots.size()), {}, {}, std::vector<char>(p.slots.size(), 0)};
  for (const dataflow::SlotBinding& b : p.params) {
    auto it = inputs.find(b.index);
    PWM_CHECK(it != inputs.end() && it->second, "program '{}': parameter {} has no shard on rank {}", p.name, b.index,
              t_->rank());
    PWM_CHECK_EQ(it->second->size(), p.slots[b.slot].bytes());
    r.slots[b.slot] = it->second;
  }
  for (size_t s = 0; s < r.slots.size(); ++s)
    if (!r.slots[s]) r.slots[s] = std::make_shared<dataflow::Buffer>(p.slots[s].bytes(), /*lazy=*/true);
  for (size_t i : r.plan.sends_first) post_send(r, i);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    switch (in.op) {
      case Op::kRecv:
        r.recvs.push_back({t_->irecv(r.at(in.slot, in.offset), in.bytes, in.peer, tag(in.xfer)), in.stage, in.peer,
                           in.bytes, r.slots[in.slot]});
        break;
      case Op::kSend:  // (posted after its source's writer, unless that was a receive)
        if (r.plan.late[i]) {
          wait_all(r.recvs, p, in.stage, stats);
          post_send(r, i);
        }
        break;
      case Op::kCopy:
        wait_all(r.recvs, p, in.stage, stats);
        std::memcpy(r.at(in.slot2, in.offset2), r.at(in.slot, in.offset), in.bytes);
        break;
      case Op::kExec:
        wait_all(r.recvs, p, in.stage, stats);
        progress(r.sends);  // (MPI moves a message only inside MPI calls: between kernels, as the Pathways worker)
        exec(r, in);
        break;
    }
    for (size_t k : r.plan.sends_after[i]) post_send(r, k);
    r.account(i);
  }
  wait_all(r.recvs, p, p.num_stages, stats);
  wait_all(r.sends, p, p.num_stages, nullptr);
  runs_++;
  if (stats) stats->peak_intermediate_bytes = r.peak;
  Shards out;
  for (const dataflow::SlotBinding& b : p.outputs) out[b.index] = r.slots[b.slot];
  return out;
}

}  // namespace pwm::static_mpmd
