#include "static_mpmd/executor.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/time.h"

namespace pwm::static_mpmd {

// The static model as the host of a walk: its tags, and a failure ends the job (no controller to
// tell, no future to fail: every rank of the job stops).
class Executor::Host final : public dataflow::WalkHost {
 public:
  Host(Executor& x, const dataflow::WorkerProgram& p, RunStats* stats) : x_(x), p_(p), stats_(stats) {}
  int tag(uint32_t xfer) override { return x_.tag(xfer); }
  std::string where() const override { return fmt::format("rank {}{}", x_.t_->rank(), x_.t_->on_host(x_.t_->rank())); }
  dataflow::SliceComms& comms() override { return x_.comms_; }
  void after_kernel(size_t, double t0, double t1, const std::exception*) override {
    if (stats_) stats_->kernel_s += t1 - t0;
  }
  bool kernel_done(size_t, const std::string& failed) override {
    if (!failed.empty()) PWM_THROW("static_mpmd: {}", failed);
    return false;
  }
  [[noreturn]] void bad_receive(size_t i, const std::string& what) override {
    const dataflow::Instr& in = p_.instrs[i];
    PWM_THROW("static_mpmd: {} {} from rank {}{} where {} bytes were expected (transfer {} of program '{}')", where(), what,
              in.peer, x_.t_->on_host(in.peer), in.bytes, in.xfer, p_.name);
  }

 private:
  Executor& x_;
  const dataflow::WorkerProgram& p_;
  RunStats* stats_;
};

Executor::Executor(std::shared_ptr<collectives::Transport> transport, double timeout_s, int channel)
    : t_(std::move(transport)), timeout_s_(timeout_s), channel_(channel),
      comms_(t_, collectives::CommOptions::from_env()) {
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

// The line of a run that stopped moving: the first receive it waits for (else the first send),
// and the node where the walk stands.
std::string Executor::describe_wait(const dataflow::Walk& w, const dataflow::WorkerProgram& p) const {
  const std::vector<size_t> pending = w.pending_transfers();
  const uint32_t node = w.standing() < p.instrs.size() ? p.instrs[w.standing()].stage : p.num_stages;
  if (pending.empty())
    return fmt::format("static_mpmd: rank {}{} made no progress in {:.0f} s in program '{}' at node {} with no transfer "
                       "posted (a stuck kernel?)",
                       t_->rank(), t_->on_host(t_->rank()), timeout_s_, p.name, node);
  size_t first = pending.front();
  for (size_t i : pending)
    if (p.instrs[i].op == dataflow::Op::kRecv) {
      first = i;
      break;
    }
  const dataflow::Instr& in = p.instrs[first];
  return fmt::format("static_mpmd: rank {}{} waited {:.0f} s for {} bytes of program '{}' (node {}) from or to rank {}{} "
                     "before node {}: that rank is gone or stuck (--coll-timeout sets the wait)",
                     t_->rank(), t_->on_host(t_->rank()), timeout_s_, in.bytes, p.name, in.stage, in.peer,
                     t_->on_host(in.peer), node);
}

Shards Executor::run(const dataflow::Plan& plan, Shards inputs, RunStats* stats) {
  const dataflow::WorkerProgram& p = plan.p;
  std::vector<dataflow::ObjectPtr> slots(p.slots.size());
  for (const dataflow::SlotBinding& b : p.params) {
    auto it = inputs.find(b.index);
    PWM_CHECK(it != inputs.end() && it->second, "program '{}': parameter {} has no shard on rank {}", p.name, b.index,
              t_->rank());
    PWM_CHECK_EQ(it->second->buf.size(), p.slots[b.slot].bytes());
    slots[b.slot] = it->second;
  }
  inputs.clear();
  dataflow::LiveBytes live;
  dataflow::Walk walk(plan, std::move(slots), *t_, &live, dataflow::WalkPolicy{true, 0, true}, p.num_stages);
  Shards out;  // (taken now: the walk lets go of a value after its last reader here)
  for (const dataflow::SlotBinding& b : p.outputs) out[b.index] = walk.slot(b.slot);
  Host host(*this, p, stats);
  double idle_since = now_s(), waited = 0;
  while (!walk.finished()) {
    if (walk.progress(host)) {
      idle_since = now_s();
      continue;
    }
    // (MPI moves a message only inside MPI calls: a pass tests every posted transfer.)
    const double t0 = now_s();
    if (t0 - idle_since > timeout_s_) PWM_THROW("{}", describe_wait(walk, p));
    t_->idle();
    waited += now_s() - t0;
  }
  runs_++;
  if (stats) {
    stats->recv_wait_s += waited;
    stats->messages += walk.sends();
    stats->bytes_sent += walk.bytes_sent();
    stats->peak_intermediate_bytes = live.peak;
    stats->donated_bytes += walk.donated_bytes();
  }
  return out;
}

}  // namespace pwm::static_mpmd
