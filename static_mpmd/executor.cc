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

// Per instruction, the slots last used by it (none bound to a parameter or an output: those
// outlive the run).
std::vector<std::vector<int32_t>> frees_after(const dataflow::WorkerProgram& p) {
  std::vector<int64_t> last(p.slots.size(), -1);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    const auto use = [&](int32_t s) {
      if (s >= 0) last[static_cast<size_t>(s)] = static_cast<int64_t>(i);
    };
    if (in.op == Op::kExec) {
      const dataflow::ExecInfo& e = p.execs.at(static_cast<size_t>(in.exec));
      for (int32_t s : e.ins) use(s);
      for (int32_t s : e.outs) use(s);
    } else {
      use(in.slot);
      use(in.slot2);
    }
  }
  for (const auto& b : p.params) last[b.slot] = -1;
  for (const auto& b : p.outputs) last[b.slot] = -1;
  std::vector<std::vector<int32_t>> frees(p.instrs.size());
  for (size_t s = 0; s < last.size(); ++s)
    if (last[s] >= 0) frees[static_cast<size_t>(last[s])].push_back(static_cast<int32_t>(s));
  return frees;
}

}  // namespace

Shards Executor::run(const dataflow::WorkerProgram& p, const Shards& inputs, RunStats* stats) {
  const std::vector<std::vector<int32_t>> frees = frees_after(p);
  std::vector<BufferPtr> slots(p.slots.size());
  for (const dataflow::SlotBinding& b : p.params) {
    auto it = inputs.find(b.index);
    PWM_CHECK(it != inputs.end() && it->second, "program '{}': parameter {} has no shard on rank {}", p.name, b.index,
              t_->rank());
    PWM_CHECK_EQ(it->second->size(), p.slots[b.slot].bytes());
    slots[b.slot] = it->second;
  }
  for (size_t s = 0; s < slots.size(); ++s)
    if (!slots[s]) slots[s] = std::make_shared<dataflow::Buffer>(p.slots[s].bytes(), /*lazy=*/true);
  const auto at = [&](int32_t slot, uint64_t offset) { return static_cast<uint8_t*>(slots[slot]->data()) + offset; };
  std::vector<Pending> recvs, sends;
  // The run's intermediates (every slot not bound to a parameter) alive at once, at most: a slot
  // takes its memory at its first write and gives it back after its last use.
  std::vector<char> inter(slots.size(), 1);  // not bound to a parameter or an output
  for (const auto& b : p.params) inter[b.slot] = 0;
  for (const auto& b : p.outputs) inter[b.slot] = 0;
  uint64_t live = 0, peak = 0;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    switch (in.op) {
      case Op::kRecv:
        recvs.push_back({t_->irecv(at(in.slot, in.offset), in.bytes, in.peer, tag(in.xfer)), in.stage, in.peer, in.bytes,
                         slots[in.slot]});
        break;
      case Op::kSend:
        sends.push_back({t_->isend(at(in.slot, in.offset), in.bytes, in.peer, tag(in.xfer)), in.stage, in.peer, in.bytes,
                         slots[in.slot]});
        if (stats) {
          stats->messages++;
          stats->bytes_sent += in.bytes;
        }
        break;
      case Op::kCopy:
        wait_all(recvs, p, in.stage, stats);
        std::memcpy(at(in.slot2, in.offset2), at(in.slot, in.offset), in.bytes);
        break;
      case Op::kExec: {
        wait_all(recvs, p, in.stage, stats);
        const dataflow::ExecInfo& e = p.execs.at(static_cast<size_t>(in.exec));
        const dataflow::KernelDef* def = dataflow::KernelRegistry::global().find(e.kernel);
        if (!def) PWM_THROW("static_mpmd: kernel '{}' of program '{}' is not registered on rank {}", e.kernel, p.name, t_->rank());
        std::vector<dataflow::KernelContext::Buffer> ins, outs;
        for (int32_t s : e.ins) ins.push_back({slots[s]->data(), &p.slots[s]});
        for (int32_t s : e.outs) outs.push_back({slots[s]->data(), &p.slots[s]});
        const double t0 = now_s();
        try {
          dataflow::KernelContext ctx(e.shard, e.num_shards, t_->rank(), e.attrs, std::move(ins), std::move(outs),
                                      e.collectives ? &comm(e) : nullptr, &e.kernel);
          def->fn(ctx);
        } catch (const std::exception& ex) {
          PWM_THROW("static_mpmd: kernel '{}' (node {} of program '{}', shard {} of {}) failed on rank {}: {}", e.kernel,
                    e.node, p.name, e.shard, e.num_shards, t_->rank(), ex.what());
        }
        if (stats) stats->kernel_s += now_s() - t0;
        break;
      }
    }
    for (size_t s = 0; s < slots.size(); ++s)  // (cheap next to a kernel; a run has tens of slots per rank)
      if (inter[s] == 1 && slots[s] && slots[s]->allocated()) {
        live += slots[s]->size();
        inter[s] = 2;
      }
    peak = std::max(peak, live);
    for (int32_t s : frees[i]) {
      if (inter[s] == 2) live -= slots[s]->size();
      slots[s].reset();  // (a transfer in flight keeps its own reference)
    }
  }
  wait_all(recvs, p, p.num_stages, stats);
  wait_all(sends, p, p.num_stages, nullptr);
  runs_++;
  if (stats) stats->peak_intermediate_bytes = peak;
  Shards out;
  for (const dataflow::SlotBinding& b : p.outputs) out[b.index] = slots[b.slot];
  return out;
}

}  // namespace pwm::static_mpmd
