// Collectives over a group of world ranks: the library's public API.
//
// A Communicator is a list of world ranks plus a context id (its own tag space). Every member
// constructs it with the same list and context; non-members are not involved at all, so a
// runtime can form device slices at any time without a collective MPI_Comm_create. Context ids
// must differ between communicators that share a rank and are used concurrently (< 1024).
//
// Which ranks must call: every collective must be called by every member of the group, in the
// same order (the per-communicator sequence number). At most 256 collectives of one communicator
// are in flight on a rank: starting the 257th first completes the oldest (the tag space repeats;
// docs/collectives.md). Set PWM_COLL_DEBUG=1 to have every call
// fingerprinted (op, algorithm, dtype, count, root, sequence number; for alltoallv the count each
// pair exchanges, as both sides of the pair see it) and a mismatch reported.
//
// Blocking: the blocking forms return when this rank's part is complete (its buffers are
// final). The i-forms return a Work at once; the caller keeps the buffers alive and untouched
// until Work::test() returns true or Work::wait() returns. Progress happens only inside
// test()/wait() (and the blocking calls): a trainer that overlaps an AllReduce with compute
// calls test() between its layers. Every wait has a watchdog (CommOptions::timeout_s, default
// 300 s or PWM_COLL_TIMEOUT): on expiry it prints the collective and the peers it waits for and
// aborts the whole job.
//
// Thread safety: a Communicator and its Works are used by one thread at a time.
// Determinism: same inputs, algorithm and group give bitwise-identical results on every member
// and every run (docs/collectives.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/transport.h"
#include "collectives/types.h"
#include "common/check.h"

namespace pwm::collectives {

// Thrown out of a collective's wait by the transport's wait hook (transport.h) when the caller
// gives the collective up: a peer was lost and the Pathways controller cancelled the run. The
// collective is abandoned as the exception leaves it (Executor::abandon): its posted receives
// are withdrawn, so that the buffers it used are the caller's again. Its group is done with:
// the peers are out of step (the controller remaps the slice onto a fresh context).
class Interrupted : public pwm::Error {
 public:
  using pwm::Error::Error;
};

class Executor;
struct CollectiveInfo;
class ScratchPool;
struct SeqWindow;

struct CommOptions {
  double timeout_s = 300.0;        // watchdog; PWM_COLL_TIMEOUT overrides the default
  bool fingerprint = false;        // PWM_COLL_DEBUG=1
  size_t segment_bytes = 256 << 10;  // ring/tree pipelining segment; PWM_COLL_SEGMENT_BYTES
  CostModel cost_model;

  // Defaults with the environment variables applied.
  static CommOptions from_env();
};

// A started collective. Move-only. Destroying an unfinished Work waits for it (the buffers it
// uses belong to the caller, who must not free them while the transport may still touch them).
class Work {
 public:
  Work();
  explicit Work(std::unique_ptr<Executor> e);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  ~Work();

  bool test();  // progresses without blocking; true once complete. Throws pwm::Error on failure.
  void wait();  // blocks until complete (watchdog applies)
  // Gives the collective up without waiting (Executor::abandon: its posted receives withdrawn):
  // for a caller whose peers left it (Interrupted). The Work is empty afterwards. The
  // communicator is out of step with its peers from then on: use a fresh context.
  void abandon();
  bool valid() const { return e_ != nullptr; }

 private:
  std::unique_ptr<Executor> e_;
};

class Communicator {
 public:
  // `world_ranks`: the group, in group-rank order, each rank once; must contain this rank.
  Communicator(std::shared_ptr<Transport> transport, std::vector<int> world_ranks, uint32_t context,
               CommOptions options = CommOptions::from_env());
  // The whole world, context 0.
  static Communicator world(std::shared_ptr<Transport> transport,
                            CommOptions options = CommOptions::from_env());
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const { return rank_; }  // index in the group
  int size() const { return static_cast<int>(group_.size()); }
  const std::vector<int>& group() const { return group_; }
  uint32_t context() const { return context_; }
  Transport& transport() { return *transport_; }
  CommOptions& options() { return options_; }
  // The algorithm kAuto resolves to for an AllReduce of `bytes` bytes on this group.
  Algorithm resolve_allreduce(Algorithm a, size_t bytes) const;
  // The algorithm kAuto resolves to for an AllToAll of `bytes_per_peer` bytes to each member
  // (alltoallv: `equal_counts` false).
  Algorithm resolve_alltoall(Algorithm a, size_t bytes_per_peer, bool equal_counts = true) const;

  // send == recv means in place. `count` is per-rank elements.
  Work iallreduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                  Algorithm algo = Algorithm::kAuto);
  // Part of a larger AllReduce: the `count` elements are elements [w.offset, w.offset + count) of
  // a vector of w.total elements, and each gets the bits the AllReduce of that whole vector gives
  // it (kAuto resolves as for w.total elements). The ring reduces an element in an order fixed
  // by its chunk of the whole vector; hd and rd in one order for every element; kMpi cannot
  // promise it and is refused for a proper window. Lets a reduction cut into other pieces than
  // another's (pathways_train's per-layer pieces against spmd_train's buckets) sum every element
  // as the other does. The ring's chunks are those of the whole vector clipped to the window, so
  // ranks may carry unequal shares (at most all of it: 2(p-1)/p N bytes becomes at most 2N).
  struct Window {
    size_t total = 0, offset = 0;
  };
  Work iallreduce_window(const void* send, void* recv, size_t count, DataType t, ReduceOp op, Window w,
                         Algorithm algo = Algorithm::kAuto);
  // send: size() * count elements; recv: count elements (block rank()).
  Work ireduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op);
  // send: count elements; recv: size() * count elements.
  Work iallgather(const void* send, void* recv, size_t count, DataType t);
  // root is a group rank.
  Work ibroadcast(void* buf, size_t count, DataType t, int root);
  // recv is written on root only (may be null elsewhere).
  Work ireduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op, int root);
  Work ibarrier();
  // AllToAll, equal counts: send holds size() * count elements, block i (count elements at
  // i * count) goes to group rank i; recv holds size() * count, block i came from group rank i.
  // In place (send == recv) is supported, at the price of one copy of the buffer into scratch.
  // Algorithms: kAuto (the cost model: kBruck for small blocks, kPairwise otherwise), kPairwise,
  // kBruck, kLinear, kMpi (MPI_Ialltoall); an AllReduce algorithm is refused (pwm::Error).
  Work ialltoall(const void* send, void* recv, size_t count, DataType t, Algorithm algo = Algorithm::kAuto);
  // AllToAll, variable counts: send_counts[i] elements go to group rank i, recv_counts[i] come
  // from it; both spans have size() entries and the blocks are packed contiguously in group-rank
  // order (block i starts at the sum of the counts before it). Every pair must agree: member a's
  // send_counts[b] == member b's recv_counts[a] (alltoall_counts() returns recv_counts so); a
  // pair that disagrees is a size mismatch (fatal, one line), or where one side's count is 0,
  // waits for the watchdog (PWM_COLL_DEBUG=1 names it at once). The caller keeps both spans, like
  // the buffers, alive and unchanged until the Work completes. In place (send == recv, holding
  // the larger of the two totals) is supported as in ialltoall. Algorithms: kAuto (kPairwise),
  // kPairwise, kLinear, kMpi (MPI_Ialltoallv); kBruck needs equal counts and is refused.
  Work ialltoallv(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, DataType t, Algorithm algo = Algorithm::kAuto);
  // Blocking: exchanges the counts (an equal-count AllToAll of one 64-bit integer per member) and
  // returns recv_counts for ialltoallv: element i is what group rank i sends this rank.
  // send_counts has size() entries.
  std::vector<size_t> alltoall_counts(std::span<const size_t> send_counts);

  void allreduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                 Algorithm algo = Algorithm::kAuto) {
    iallreduce(send, recv, count, t, op, algo).wait();
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op) {
    ireduce_scatter(send, recv, count, t, op).wait();
  }
  void allgather(const void* send, void* recv, size_t count, DataType t) {
    iallgather(send, recv, count, t).wait();
  }
  void broadcast(void* buf, size_t count, DataType t, int root) { ibroadcast(buf, count, t, root).wait(); }
  void reduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op, int root) {
    ireduce(send, recv, count, t, op, root).wait();
  }
  void barrier() { ibarrier().wait(); }
  void alltoall(const void* send, void* recv, size_t count, DataType t, Algorithm algo = Algorithm::kAuto) {
    ialltoall(send, recv, count, t, algo).wait();
  }
  void alltoallv(const void* send, std::span<const size_t> send_counts, void* recv,
                 std::span<const size_t> recv_counts, DataType t, Algorithm algo = Algorithm::kAuto) {
    ialltoallv(send, send_counts, recv, recv_counts, t, algo).wait();
  }

  // Typed conveniences, in place.
  template <typename T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum, Algorithm algo = Algorithm::kAuto) {
    allreduce(data.data(), data.data(), data.size(), dtype_of<std::remove_const_t<T>>(), op, algo);
  }
  template <typename T>
  void broadcast(std::span<T> data, int root) {
    broadcast(data.data(), data.size(), dtype_of<T>(), root);
  }

 private:
  CollectiveInfo make_info(const char* op, Algorithm algo, DataType t, ReduceOp redop,
                                  size_t count, int root);
  // Both take the call's sequence number: call them only once the arguments are checked.
  Work start(const CollectiveInfo& info, const std::function<void(class Schedule&)>& build);
  Work start_native(const CollectiveInfo& info, std::unique_ptr<NativeOp> native);

  std::shared_ptr<Transport> transport_;
  std::vector<int> group_;
  uint32_t context_;
  int rank_ = -1;
  CommOptions options_;
  uint64_t seq_ = 0;
  std::shared_ptr<ScratchPool> pool_;
  std::shared_ptr<SeqWindow> window_;  // this rank's collectives of this communicator in flight
};

// What a float64 sum AllReduce with Algorithm::kRecursiveDoubling over v.size() ranks returns,
// rank r contributing v[r], computed in one place: the same additions in the same grouping
// (halving_doubling.cc: the fold of the first 2 rem ranks, then pairs at distance 1, 2, 4, ...,
// the lower new rank's operand first). For a program that gathers the summands itself (the
// expert island's squared norms) and must get the collective's bits.
double recursive_doubling_sum(std::span<const double> v);

// Takes and discards on this rank the messages of a communicator context that its peers sent and
// no receive here took. After a loss the context's collectives are abandoned, and before the
// context is handed out again nothing of it may be left to match a new receive. `left` lists, per
// world rank, how many messages of the context from that rank are still to be taken: what the
// peer counts as sent here minus what this rank counts as received (Transport::traffic), so that
// the drain ends when the last one is in, not after a guess of how long messages travel.
// progress() takes what has arrived (one probe per tag of the context, 512) and is true once
// every message is taken; it never blocks. A message taken is counted as received. Uses the
// transport from its one user thread, like the collectives.
class ContextDrain {
 public:
  ContextDrain(std::shared_ptr<Transport> t, uint32_t context, std::map<int, uint64_t> left);
  bool progress();
  uint64_t left() const;
  uint32_t context() const { return context_; }
  // World rank `peer` was lost: its messages still to come may never arrive, so none is waited
  // for (those that do arrive stay unmatched: a later group must not include it).
  void give_up(int peer) { left_.erase(peer); }

 private:
  std::shared_ptr<Transport> t_;
  uint32_t context_;
  std::map<int, uint64_t> left_;
};

}  // namespace pwm::collectives
