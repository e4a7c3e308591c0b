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
          PWM_THROW("static_mpmd: rank {}{} waited {:.0f} s for {} bytes of program '{}' (node {}) from or to rank {}{} "
                    "before node {}: that rank is gone or stuck (--coll-timeout sets the wait)",
                    t_->rank(), t_->on_host(t_->rank()), timeout_s_, r.bytes, p.name, r.node, r.peer, t_->on_host(r.peer), node);
    }
    t_->idle();
  }
  if (stats) stats->recv_wait_s += now_s() - t0;
  reqs.erase(std::remove_if(reqs.begin(), reqs.end(), [](const Pending& r) { return r.done; }), reqs.end());
}

Prepared::Prepared(dataflow::WorkerProgram p) : p_(std::move(p)) {
  const size_t n = p_.instrs.size();
  sends_after_.resize(n);
  late_.assign(n, 0);
  writes_.resize(n);
  frees_.resize(n);
  intermediate_.assign(p_.slots.size(), 1);
  std::vector<int64_t> writer(p_.slots.size(), -1), last(p_.slots.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = p_.instrs[i];
    const auto use = [&](int32_t s) {
      if (s >= 0) last[static_cast<size_t>(s)] = static_cast<int64_t>(i);
    };
    const auto write = [&](int32_t s) {
      writer[static_cast<size_t>(s)] = static_cast<int64_t>(i);
      writes_[i].push_back(s);
    };
    if (in.op == Op::kExec) {
      const dataflow::ExecInfo& e = p_.execs.at(static_cast<size_t>(in.exec));
      for (int32_t s : e.ins) use(s);
      for (int32_t s : e.outs) use(s), write(s);
    } else {
      use(in.slot);
      use(in.slot2);
      if (in.op == Op::kRecv) write(in.slot);
      if (in.op == Op::kCopy) write(in.slot2);
    }
    if (in.op != Op::kSend) continue;
    const int64_t w = writer[in.slot];
    if (w < 0) sends_first_.push_back(i);
    else if (p_.instrs[static_cast<size_t>(w)].op == Op::kRecv) late_[i] = 1;  // (after that receive completes)
    else sends_after_[static_cast<size_t>(w)].push_back(i);
  }
  for (const auto& b : p_.params) intermediate_[b.slot] = 0, last[b.slot] = -1;
  for (const auto& b : p_.outputs) intermediate_[b.slot] = 0, last[b.slot] = -1;
  for (size_t s = 0; s < last.size(); ++s)
    if (last[s] >= 0) frees_[static_cast<size_t>(last[s])].push_back(static_cast<int32_t>(s));
}

// One run's state on this rank.
struct Executor::Run {
  const Prepared& plan;
  const dataflow::WorkerProgram& p;
  RunStats* stats;
  std::vector<BufferPtr> slots;
  std::vector<Pending> recvs, sends;
  std::vector<char> counted;  // per slot: its bytes are in `live`
  uint64_t live = 0, peak = 0;

  uint8_t* at(int32_t slot, uint64_t offset) { return static_cast<uint8_t*>(slots[slot]->data()) + offset; }
  // After instruction i: count the intermediates it wrote first (a slot's memory is taken at its
  // first write), then drop the slots it used last.
  void account(size_t i) {
    for (int32_t s : plan.writes_[i])
      if (plan.intermediate_[s] && !counted[s]) {
        live += slots[s]->size();
        counted[s] = 1;
      }
    peak = std::max(peak, live);
    for (int32_t s : plan.frees_[i]) {
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

Shards Executor::run(const Prepared& prepared, const Shards& inputs, RunStats* stats) {
  const dataflow::WorkerProgram& p = prepared.p_;
  Run r{prepared, p, stats, std::vector<BufferPtr>(p.slots.size()), {}, {}, std::vector<char>(p.slots.size(), 0)};
  for (const dataflow::SlotBinding& b : p.params) {
    auto it = inputs.find(b.index);
    PWM_CHECK(it != inputs.end() && it->second, "program '{}': parameter {} has no shard on rank {}", p.name, b.index,
              t_->rank());
    PWM_CHECK_EQ(it->second->size(), p.slots[b.slot].bytes());
    r.slots[b.slot] = it->second;
  }
  for (size_t s = 0; s < r.slots.size(); ++s)
    if (!r.slots[s]) r.slots[s] = std::make_shared<dataflow::Buffer>(p.slots[s].bytes(), /*lazy=*/true);
  for (size_t i : prepared.sends_first_) post_send(r, i);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const Instr& in = p.instrs[i];
    switch (in.op) {
      case Op::kRecv:
        r.recvs.push_back({t_->irecv(r.at(in.slot, in.offset), in.bytes, in.peer, tag(in.xfer)), in.stage, in.peer,
                           in.bytes, r.slots[in.slot]});
        break;
      case Op::kSend:  // (posted after its source's writer, unless that was a receive)
        if (prepared.late_[i]) {
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
    for (size_t k : prepared.sends_after_[i]) post_send(r, k);
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
