// Runs one Schedule over a Transport: posts ready sends and receives, runs ready local steps,
// tests what is in flight, and (in wait) enforces the watchdog timeout. Internal header; users
// see it only through collectives::Work.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/schedule.h"
#include "collectives/transport.h"

namespace pwm::collectives {

// What a collective is, for the watchdog's and the fingerprint check's messages.
struct CollectiveInfo {
  const char* op = "";         // "allreduce", "broadcast", ...
  Algorithm algo = Algorithm::kAuto;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  uint64_t seq = 0;            // per-communicator sequence number
  uint32_t context = 0;
  size_t count = 0;
  int root = -1;
  const std::vector<int>* group = nullptr;  // world ranks (owned by the communicator)
  // alltoallv: this rank's counts per group rank (the caller's; alive until the collective
  // completes); count is the sum of send_counts. Empty for every other op.
  std::span<const size_t> send_counts, recv_counts;
  int group_rank = 0;
  std::string describe() const;  // "allreduce(ring, float32, sum, count=..., seq=3, context=0, group=[0,1])"
};

class Executor;

// A communicator's collectives in flight on this rank, by sequence number (communicator.cc keeps
// their tags apart with it). An executor leaves it when destroyed.
struct SeqWindow {
  std::map<uint64_t, Executor*> live;
};

class Executor {
 public:
  // `tag` is this collective's tag; `fingerprint_tag` is used for the debug-mode fingerprint
  // exchange (enabled when fingerprint_tag >= 0) that runs before the schedule.
  Executor(Transport& transport, Schedule&& schedule, CollectiveInfo info, int tag,
           int fingerprint_tag, double timeout_s);
  // Runs kMpi: the whole collective is the transport's native op.
  Executor(Transport& transport, std::unique_ptr<NativeOp> native, CollectiveInfo info,
           double timeout_s);
  // An unfinished collective is abandoned here (abandon()): its caller left it (Interrupted).
  ~Executor();

  // Does all that can be done without blocking. Returns true once the collective is complete.
  // Also fires the watchdog when the timeout has passed since the collective started. A failure
  // (a message of another size than the posted receive, a fingerprint mismatch, a transport
  // error) is fatal: one line and Transport::abort, never an exception that would unwind past
  // buffers MPI may still be writing (the in-process fabric's abort throws, for tests).
  bool progress();
  // Progresses until complete; fires the watchdog after the timeout.
  void wait();
  bool done() const { return done_; }
  // Registers this executor in `window` under its sequence number until it is destroyed.
  void track_in(std::shared_ptr<SeqWindow> window);

 private:
  bool progress_schedule(Schedule& s, std::vector<uint8_t>& state, std::vector<Request>& req,
                         std::vector<uint32_t>& active, uint32_t& first, int tag);
  void start_fingerprint(int fingerprint_tag);
  void check_fingerprints();
  [[noreturn]] void fire_watchdog();
  // Withdraws the posted receives of both schedules and waits (a bounded time, running the wait
  // hook for the heartbeat) for those whose message is arriving; one that does not end ends the
  // job (Transport::abort), since its buffer is about to be freed. Posted sends go to the
  // transport (Transport::abandon) with what their buffers belong to: the caller's owner
  // (BufferOwnerScope, taken when the collective started) and this executor's own buffers. A
  // native collective cannot be withdrawn at all: that ends the job too. (Neither abort is
  // reached in process, whose abort throws: its receives always withdraw and it has no native
  // collectives.)
  void abandon() noexcept;

  Transport& t_;
  Schedule sched_;
  CollectiveInfo info_;
  int tag_;
  double timeout_s_;
  int64_t start_us_;
  int64_t last_us_;  // when progress() last found the collective unfinished
  bool done_ = false;

  std::vector<uint8_t> state_;    // per step: 0 pending, 1 posted, 2 done
  std::vector<Request> req_;      // per step, valid while posted
  std::vector<uint32_t> active_;  // posted send/recv steps
  uint32_t first_ = 0;            // every step before it is done
  std::vector<uint8_t> send_blocked_, recv_blocked_;  // per peer, scratch for one pass

  // Debug-mode fingerprints: a small schedule run to completion before the main one.
  std::unique_ptr<Schedule> fp_sched_;
  std::vector<uint8_t> fp_state_;
  std::vector<Request> fp_req_;
  std::vector<uint32_t> fp_active_;
  uint32_t fp_first_ = 0;
  int fp_tag_ = -1;
  std::vector<uint64_t> fp_buf_;   // group size x kFingerprintWords: received (own slot: this rank's)
  std::vector<uint64_t> fp_send_;  // group size x kFingerprintWords: sent to each member
  std::vector<uint64_t> fp_expect_;  // per member: the count word expected from it

  std::shared_ptr<const void> owner_;  // the caller's buffers' (BufferOwnerScope::current())
  // What an abandoned collective's sends may still read, kept by the transport (abandon()).
  struct LeftBuffers {
    Schedule sched;
    std::unique_ptr<Schedule> fp_sched;
    std::vector<uint64_t> fp_send, fp_buf;
    std::shared_ptr<const void> caller;
  };

  std::unique_ptr<NativeOp> native_;
  std::shared_ptr<SeqWindow> window_;
};

}  // namespace pwm::collectives
