// The interpreter of a device's instruction list (dataflow/lowering.h), the one both MPMD
// runtimes run: the Pathways worker drives a Walk per run among its other work (messages, moves,
// fetches: pathways/worker_runs.cc), the static model's Executor drives one run's Walk until it is
// done (static_mpmd/executor.cc). What differs between them is a WalkPolicy and a WalkHost: the
// tags, the island order, cancels, the trace, who is told what.
//
// A Walk never blocks except inside a kernel. Each progress() pass posts every send whose value
// exists (wherever it sits in the list: the walk may reach it a whole kernel later on a pipeline
// stage) and, unless the run is in order, every receive of a released stage; then it goes down
// the list from the first instruction not done: a receive completes, a copy copies, a kernel runs
// once its inputs are resolved (and, in order, once every kernel before it ran). A value is
// dropped after its last reader on this device: a run holds what its schedule keeps alive. A
// kernel that can run in place (Signature::reuse) takes the buffer of an input that dies at it
// and that nothing outside the run holds: a donated input (the caller's last handle passed in).
// Instructions are in one global order on every device (a node's transfers, then the node), so a
// device that follows it matches every peer's list: the order fixed when the program was built
// is the deadlock freedom (OneFlow's argument), for both runtimes.
//
// Values are Objects (dataflow/object.h): a kernel whose input failed does not run and fails its
// outputs, except a gang kernel (collectives inside), which runs so that its peers are not left
// waiting; a failure reaches whoever reads the output. One thread per Walk.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/transport.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/object.h"

namespace pwm::dataflow {

// A device's list with what running it needs, worked out once per program (every run of it
// shares this).
struct Plan {
  explicit Plan(WorkerProgram program);
  WorkerProgram p;
  std::vector<const KernelDef*> kernels;  // per exec: nullptr when the kernel is not registered here
  std::vector<uint32_t> readers;          // per slot: instructions reading it (kernel inputs, sends, copies)
  std::vector<uint8_t> intermediate;      // per slot: bound to no parameter and no output
  std::vector<uint32_t> execs_before;     // per instruction: kernels before it in the list
  std::vector<uint32_t> transfers;        // the sends and receives, in list order
  // per slot: every kernel reading it takes a prefix (ArgSpec::prefix), so a receive into it may
  // be shorter than its static size (its sender's KernelContext::set_used)
  std::vector<uint8_t> prefix;
  std::vector<std::vector<uint8_t>> out_prefix;  // per exec, per output: ArgSpec::prefix (set_used applies)
  // per exec, per output: the input slot whose buffer it may take (Signature::reuse: the kernel
  // runs in place), or -1. Only where the output has this kernel as its one writer, the input
  // is read once by it, both have the same size and no instruction after it reads the input.
  // The walk donates only when, at run time, nothing else holds the input (Walk::run_kernel).
  std::vector<std::vector<int32_t>> donor;
};

// Bytes of runs' intermediates alive at once (a Walk adds a slot's bytes at its first write and
// takes them off after its last reader): a Pathways worker's over its runs, a static run's own.
struct LiveBytes {
  uint64_t live = 0, peak = 0;
};

// The communicators of a device's slices: one per slice context, shared by every program on that
// slice, so that its collectives' sequence numbers stay in step. A context whose group changed
// (a slice remapped after a loss) gets a new one.
class SliceComms {
 public:
  SliceComms(std::shared_ptr<collectives::Transport> t, collectives::CommOptions o) : t_(std::move(t)), o_(o) {}
  collectives::Communicator& get(const ExecInfo& e);
  // Drops the communicators of contexts [first, first + n) (a reclaimed context block, which a
  // later slice reuses from sequence number 0). No collective may be in flight on them.
  void forget(uint32_t first, uint32_t n) {
    comms_.erase(comms_.lower_bound(first), comms_.lower_bound(first + n));
  }

 private:
  std::shared_ptr<collectives::Transport> t_;
  collectives::CommOptions o_;
  std::map<uint32_t, std::unique_ptr<collectives::Communicator>> comms_;
};

struct WalkPolicy {
  // In order: kernels strictly in list order, a receive posted once at most `recv_ahead`
  // kernels before it are left (the schedule bounds the buffers). Otherwise kernels run as their
  // inputs resolve and every receive of a released stage is posted once the run has started a
  // kernel (before that, only the receives ahead of its first kernel in the list).
  bool in_order = false;
  uint32_t recv_ahead = 0;
  // Intermediates take their memory at first write; else at once (a memory cap's admission
  // reserves a run's buffers up front).
  bool lazy = true;
};

// What the runtime driving a Walk supplies; called from inside progress() and cancel() only.
class WalkHost {
 public:
  virtual ~WalkHost() = default;
  virtual int tag(uint32_t xfer) = 0;  // the tag of transfer `xfer` of this run (both sides agree)
  virtual std::string where() const = 0;  // "device 0 (world rank 1)": for failure lines
  virtual SliceComms& comms() = 0;
  // Gang kernel instruction i may start now (Pathways: its turn in the island's order).
  virtual bool may_start(size_t i) { return (void)i, true; }
  // "" or why no kernel of this run may start any more (Pathways: a cancel read inside a kernel).
  virtual std::string stopped() { return {}; }
  // Around a kernel that runs (t0, t1: now_s()); `failure` when it threw. Pathways traces,
  // flushes its answers before a long kernel and reports an interrupted collective.
  virtual void before_kernel(size_t i) { (void)i; }
  virtual void after_kernel(size_t i, double t0, double t1, const std::exception* failure) {
    (void)i, (void)t0, (void)t1, (void)failure;
  }
  // Kernel instruction i is done: ran, skipped or cancelled; `failed` "" or why it failed. True:
  // end this pass now (Pathways: a long kernel ran; the worker's messages come first). May throw
  // (the static model ends the job on a failure).
  virtual bool kernel_done(size_t i, const std::string& failed) { return (void)i, (void)failed, false; }
  virtual void posted(size_t i) { (void)i; }          // transfer i is about to be posted
  // transfer i completed, having moved `bytes` (a prefix of a piece: Object::used)
  virtual void transfer_done(size_t i, uint64_t bytes) { (void)i, (void)bytes; }
  virtual void stage_done(uint32_t stage) { (void)stage; }  // this device's part of a stage is done
  // A receive got a message of another size than the list says (`what`): ends the job.
  [[noreturn]] virtual void bad_receive(size_t i, const std::string& what) = 0;
};

// One run of a Plan on this device.
class Walk {
 public:
  // `slots`: one per slot of the plan; the bound ones set (inputs, outputs the caller also holds),
  // the others are made here. `released`: stages below it may run (release() opens more).
  Walk(const Plan& plan, std::vector<ObjectPtr> slots, collectives::Transport& t, LiveBytes* live,
       WalkPolicy policy, uint32_t released);
  ~Walk();  // the run's intermediates leave *live
  Walk(Walk&&) noexcept;
  Walk& operator=(Walk&&) = delete;

  // One pass; true if anything moved. Throws only what a WalkHost hook throws.
  bool progress(WalkHost& host);
  // Stops where it is: posted receives withdrawn, other posted transfers handed to `abandon`
  // (their buffers must live until MPI is done with them), kernels not run never run (each told
  // to host.kernel_done), every value not yet written failed with `reason`.
  void cancel(const std::string& reason, WalkHost& host,
              const std::function<void(collectives::Request, ObjectPtr)>& abandon);

  bool finished() const { return left_ == 0; }
  void release(uint32_t stages) { released_ = std::max(released_, stages); }
  uint32_t released() const { return released_; }
  const ObjectPtr& slot(int32_t s) const { return slots_[static_cast<size_t>(s)]; }
  // The first failure of a kernel of this run on this device ("" none).
  const std::string& error() const { return error_; }
  // The transfers posted and not complete (instruction indices): what a stuck run waits for.
  std::vector<size_t> pending_transfers() const;
  size_t standing() const { return first_; }  // the first instruction not done (the list's size: none)
  uint64_t sends() const { return sends_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  // Bytes of inputs whose buffer an output took (Plan::donor): written in place, not copied.
  uint64_t donated_bytes() const { return donated_bytes_; }

 private:
  enum : uint8_t { kWaiting = 0, kPosted = 1, kDone = 2 };
  bool post_transfers(WalkHost& host);
  void post_send(WalkHost& host, size_t i);
  uint64_t send_bytes(const Instr& in) const;
  void post_recv(WalkHost& host, size_t i);
  bool may_post_recv(size_t i) const;
  bool step_recv(WalkHost& host, size_t i);
  bool step_send(WalkHost& host, size_t i);
  bool step_copy(size_t i);
  bool try_exec(WalkHost& host, size_t i, bool* stop);
  std::string run_kernel(WalkHost& host, size_t i, bool gang);
  void done(WalkHost& host, size_t i);
  void* write_ptr(int32_t s);
  void donate(size_t exec);
  void read_done(int32_t s);
  void uncount(size_t s);

  const Plan* plan_;
  collectives::Transport* t_;
  LiveBytes* live_;
  WalkPolicy policy_;
  std::vector<ObjectPtr> slots_;
  std::vector<uint8_t> state_;                // per instruction
  std::vector<collectives::Request> reqs_;    // per instruction, while posted
  std::vector<uint32_t> stage_left_;          // instructions not done, per stage
  std::vector<uint32_t> readers_left_;        // per slot: readers not done (dropped at 0)
  std::vector<uint8_t> counted_;              // per slot: its bytes are in *live_
  uint32_t released_ = 0;
  size_t first_ = 0, left_ = 0;
  uint32_t execs_done_ = 0;
  bool started_ = false;                      // a kernel of this run has started (may_post_recv)
  size_t next_exec_ = 0;                      // in order: the first kernel not done
  const Object* blocked_on_ = nullptr;        // see progress()'s fast path
  std::string error_;
  uint64_t sends_ = 0, bytes_sent_ = 0, donated_bytes_ = 0;
};

}  // namespace pwm::dataflow
