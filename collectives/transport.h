// Point-to-point transport under the collectives: the only thing algorithms talk to.
//
// Algorithms never see MPI (gloo's split of algorithms from transports). Two implementations:
// MpiTransport (mpi_transport.h, any MPI library through MPI_Isend/MPI_Irecv on private duplicates of
// MPI_COMM_WORLD) and InProcFabric (inproc_transport.h, ranks as threads of one process, for fast
// unit tests).
//
// Matching: a receive matches the oldest unmatched send with the same (source, tag), MPI's
// non-overtaking rule. Thread safety: one transport object per rank, used by one thread at a
// time (the MPI transport asks for MPI_THREAD_SERIALIZED or better).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/types.h"

namespace pwm::collectives {

// The tag space. MPI guarantees only MPI_TAG_UB >= 32767 (MPICH's is 2^28 - 1, OpenMPI's
// 2^31 - 1, other libraries' smaller), so a tag on the wire has kWireTagBits = 15 bits. A logical
// tag, as the transports take it, is `channel << 15 | wire tag`: the channel picks one of
// kChannels private duplicates of MPI_COMM_WORLD that every rank creates once at start-up (a
// communicator is MPI's own separate matching space), the wire tag is the MPI tag on it. Users
// split the channels among themselves (collectives/communicator.cc: channels [0, 16) for
// communicator contexts; pathways/tags.h: the rest), never building a tag at or above
// kLogicalTagLimit. The in-process fabric checks the same bounds, so a layout that overflows is
// caught by the unit tests too.
constexpr int kWireTagBits = 15;
constexpr int kWireTagLimit = 1 << kWireTagBits;  // wire tags are in [0, 32768)
constexpr int kChannels = 64;
constexpr int kLogicalTagLimit = kChannels << kWireTagBits;
constexpr int kCommunicatorChannels = 16;  // channels [0, 16): Communicator contexts
constexpr int kFirstFreeChannel = kCommunicatorChannels;  // [16, kChannels): other users
constexpr int logical_tag(int channel, int wire_tag) { return channel << kWireTagBits | wire_tag; }
constexpr int tag_channel(int logical) { return logical >> kWireTagBits; }
constexpr int wire_tag(int logical) { return logical & (kWireTagLimit - 1); }

// An in-flight send or receive. Opaque; valid until the transport's test() returns true.
struct Request {
  uint64_t handle = 0;
};

// A collective run by the transport's native library on a group (algorithm kMpi).
class NativeOp {
 public:
  virtual ~NativeOp() = default;
  virtual bool test() = 0;  // true once complete; throws pwm::Error on failure
};

// What owns the caller's buffers of the collectives this thread starts while the scope lives
// (scopes nest; the innermost names the owner). An executor takes the owner when it starts; if
// its collective is left unfinished (Interrupted, Work::abandon), the owner goes with its posted
// sends to Transport::abandon, so the caller's buffers those sends read live until MPI is done
// with them. The dataflow interpreter opens one around each kernel (its inputs and outputs).
// Outside any scope the owner is empty: the caller's send buffers must then live as long as the
// transport (as a trainer's gradient buffers do).
class BufferOwnerScope {
 public:
  using Make = std::function<std::shared_ptr<const void>()>;
  explicit BufferOwnerScope(std::shared_ptr<const void> owner);
  // The owner made by `make` when a collective first asks for it (once per scope): a scope that
  // starts no collective costs no allocation (the interpreter opens one per kernel).
  explicit BufferOwnerScope(Make make);
  ~BufferOwnerScope();
  BufferOwnerScope(const BufferOwnerScope&) = delete;
  BufferOwnerScope& operator=(const BufferOwnerScope&) = delete;
  static std::shared_ptr<const void> current();

 private:
  struct State {
    std::shared_ptr<const void> owner;
    Make make;
  };
  State state_;
  State* previous_;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;  // this process's world rank
  virtual int size() const = 0;  // world size
  // The largest logical tag isend/irecv accept: kLogicalTagLimit - 1 on every transport.
  int max_tag() const { return kLogicalTagLimit - 1; }
  virtual std::string name() const = 0;
  // The host world rank `rank` runs on (MPI_Get_processor_name; "" where the transport has no
  // hosts), for error messages that must say where a rank is.
  virtual std::string host_of(int rank) const { return ""; }
  // " on <host>" of world rank `rank`, or "" where the transport has no hosts: for those lines.
  std::string on_host(int rank) const {
    const std::string h = host_of(rank);
    return h.empty() ? h : " on " + h;
  }
  // World rank `rank`'s now_us() minus world rank 0's, measured once at start-up (0 where all
  // ranks share one clock, as in the in-process fabric). A timestamp t taken on `rank` is
  // t - clock_offset_us(rank) on rank 0's clock (clock_sync.h).
  virtual int64_t clock_offset_us(int rank) const { return 0; }
  // The bound on that offset's error (half the round trip it was measured with).
  virtual int64_t clock_error_us(int rank) const { return 0; }

  // Start a send/receive of `bytes` bytes to/from world rank `peer` with a logical tag in
  // [0, max_tag()]. Any size_t count: the MPI transport sends messages over 2^31 - 1 bytes with a
  // derived datatype (MPI counts are int). The buffer must stay valid and (for a send)
  // unmodified until test() reports completion.
  virtual Request isend(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* buf, size_t bytes, int peer, int tag) = 0;

  // Non-blocking completion check. On completion of a receive, *received is set to the number of
  // bytes that arrived. Throws pwm::Error on a transport failure (e.g. a message longer than
  // the posted receive).
  virtual bool test(Request& r, size_t* received) = 0;

  // Withdraws a posted receive (MPI_Cancel) whose collective was left (Interrupted, below).
  // True once the request is over, withdrawn or complete (its message had arrived): the buffer
  // is the caller's again. False while a message that matched it is still arriving (or the
  // cancel failed): test() it until it completes. Call once per request. Never throws.
  // `received`, when given, is set with true: whether the request ended with its message taken
  // (it had matched before the cancel) rather than withdrawn.
  virtual bool cancel_recv(Request& r, bool* received = nullptr) = 0;
  // Gives up a posted request whose collective or transfer was left (a peer was lost): a send,
  // or a receive whose message had matched (cancel_recv false). MPI may use its buffer until the
  // request completes, and nothing else says when (MPI-4 deprecates cancelling sends; after
  // MPI_Request_free a send's buffer can never be freed safely). So the transport keeps the
  // request and `owner`, what keeps its buffer alive, and drops `owner` once reap_abandoned()
  // finds the request complete (or failed: then MPI is done with it too). A send whose receiver
  // never takes it (a lost peer, or one that left too) stays kept: when the transport is
  // destroyed, such requests are freed and their owners leaked, so the buffers outlive MPI. The
  // handle is invalid afterwards. Never throws. In process, sends are complete when posted.
  void abandon(Request& r, std::shared_ptr<const void> owner);
  // Tests the kept requests (abandon); returns how many are still kept. Called by idle() and by
  // the users' own progress loops. Never throws.
  size_t reap_abandoned();
  size_t abandoned() const { return abandoned_.size(); }

  // Messages of communicator context `context` (communicator.h) that this rank's collectives
  // posted to each world rank, and received from each: counted by the executors (a withdrawn
  // receive is not counted, one whose message arrived is). After a loss, what a peer counts as
  // sent here minus what this rank counts as received is what of that context is still on its
  // way here or waiting unmatched: ContextDrain (communicator.h) takes exactly that.
  struct Traffic {
    std::vector<uint64_t> sent, received;  // by world rank (empty: none yet)
  };
  Traffic traffic(uint32_t context) const;
  void count_message(uint32_t context, int peer, bool sent);
  // Takes one message from world rank `peer` with logical tag `tag` that arrived and matched no
  // receive, if there is one (MPI_Improbe): it can match no receive afterwards. Its bytes are
  // received into a buffer the transport keeps until they are in (abandon), then dropped.
  virtual bool take_message(int peer, int tag) = 0;

  // Called by a waiting collective when a progress pass found nothing to do. MPI must be polled
  // (its progress engine runs inside MPI_Test), so the MPI transport only yields its core, and
  // only when its host runs more ranks than it has cores; the in-process fabric always yields so
  // that oversubscribed rank threads can run.
  virtual void idle() {}

  // A hook run by a collective's blocking wait after each idle pass (after idle()), on the
  // waiting thread: the Pathways worker sends its heartbeat from there while a kernel waits in
  // a collective (pathways/liveness.h), and, with in-job recovery, reads the controller's
  // cancel of the run (a peer was lost). It must not start or wait for a collective. It may
  // throw Interrupted (communicator.h): the wait ends with it and the collective is abandoned
  // (its receives withdrawn; the caller may free its buffers). Set and cleared by the
  // transport's one user thread; empty: nothing runs.
  void set_wait_hook(std::function<void()> hook) { wait_hook_ = std::move(hook); }
  void run_wait_hook() {
    if (wait_hook_) wait_hook_();
  }

  // Ends the whole job after a fatal collective error (the watchdog). The MPI transport prints
  // `message`, waits a 1 s grace (so the other stuck ranks' reports get out too) and calls
  // MPI_Abort; the in-process fabric throws CollectiveTimeout.
  [[noreturn]] virtual void abort(const std::string& message) = 0;

  // Algorithm kMpi. The default throws: only the MPI transport has a native library.
  // `group` lists world ranks; every member must call it, in the same order as other kMpi calls.
  virtual std::unique_ptr<NativeOp> start_native_allreduce(const std::vector<int>& group,
                                                           const void* send, void* recv,
                                                           size_t count, DataType dtype,
                                                           ReduceOp op);
  // AllToAll (kMpi): block i, `bytes_per_peer` bytes at i * bytes_per_peer, to group rank i.
  // send == recv: in place. Every member must call, as above.
  virtual std::unique_ptr<NativeOp> start_native_alltoall(const std::vector<int>& group, const void* send,
                                                          void* recv, size_t bytes_per_peer);
  // AllToAllv (kMpi): send_bytes[i] bytes to group rank i, recv_bytes[i] from it, blocks packed
  // in rank order. send == recv: in place. Every member must call, as above.
  virtual std::unique_ptr<NativeOp> start_native_alltoallv(const std::vector<int>& group, const void* send,
                                                           const std::vector<size_t>& send_bytes, void* recv,
                                                           const std::vector<size_t>& recv_bytes);

 private:
  std::function<void()> wait_hook_;
  struct Kept {
    Request req;
    std::shared_ptr<const void> owner;
  };
  std::vector<Kept> abandoned_;
  std::map<uint32_t, Traffic> traffic_;

 protected:
  // The transport's end: the requests still kept are given up and their owners leaked
  // (abandon). The MPI transport frees the requests here (MPI_Request_free), before MPI ends.
  virtual void free_request(Request& r) { r = Request{}; }
  void leak_abandoned();
};

}  // namespace pwm::collectives
