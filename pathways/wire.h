// The controller <-> worker wire protocol: message types, a byte writer/reader, and the framed
// Channel that carries them over the collectives' Transport (docs/pathways.md, "Wire protocol").
//
// Messages are bundled: everything posted to one peer between two flush() calls travels as one
// frame ([u32 type][u32 length][payload] repeated), so a controller that dispatches 100 runs in
// one pass sends one MPI message per worker, and a worker that finishes several runs in one
// pass answers with one. A frame up to kInlineBytes travels in one MPI message on
// kCtrlHeaderTag; a larger one sends a 16-byte header there and its bytes on kCtrlBodyTag
// (MPI's non-overtaking rule keeps headers and bodies of one sender in order).
//
// Thread safety: a Channel is used by one thread (the thread that owns MPI on that rank).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/transport.h"
#include "common/check.h"

namespace pwm::pathways {

enum class MsgType : uint32_t {
  // controller -> worker
  kLoadProgram = 1,   // WorkerProgram (lowering.h)
  kEvictProgram = 2,  // u64 program id
  kRun = 3,           // RunHeader: run id, program id, flags, input object ids
  kReleaseStage = 4,  // u64 run id, u32 stage (sequential dispatch)
  kPut = 5,           // u64 object, u64 owner, TensorSpec, bytes: a client's value, one shard
  kFetch = 6,         // u64 request, u64 object: send the shard back
  kFree = 7,          // vector<u64> objects
  kFreeOwner = 8,     // u64 client id
  kMoveOut = 9,       // u64 object, i32 to rank, i32 tag
  kMoveIn = 10,       // u64 object, u64 owner, TensorSpec, i32 from rank, i32 tag
  kStats = 11,        // u64 request
  kShutdown = 12,
  // worker -> controller
  kHello = 32,       // string host name
  kRunDone = 33,     // u64 run id, string error ("" = ok), f64 summed kernel seconds
  kStageDone = 34,   // u64 run id, u32 stage
  kNodeEvent = 35,   // u64 run id, u32 node, u8 started(1)/finished(0)
  kFetchReply = 36,  // u64 request, string error, bytes
  kStatsReply = 37,  // u64 request, WorkerStats
  kBye = 38,
  kTrace = 39,       // vector of trace records (kernel executions), before bye
};
const char* msg_type_name(MsgType t);

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    size_t o = buf_.size();
    buf_.resize(o + n);
    if (n) std::memcpy(buf_.data() + o, p, n);
  }
  void str(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    bytes(v.data(), v.size() * sizeof(T));
  }
  std::vector<uint8_t> take() { return std::move(buf_); }
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t> buf_;
};

// Reads what a Writer wrote; a short or malformed message throws pwm::Error.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  explicit Reader(const std::vector<uint8_t>& v) : Reader(v.data(), v.size()) {}
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, bytes(sizeof(T)), sizeof(T));
    return v;
  }
  const uint8_t* bytes(size_t n) {
    if (n > n_ - o_) PWM_THROW("pathways wire: message truncated (need {} bytes at {} of {})", n, o_, n_);
    const uint8_t* r = p_ + o_;
    o_ += n;
    return r;
  }
  std::string str() {
    auto n = get<uint32_t>();
    auto p = bytes(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  template <typename T>
  std::vector<T> vec() {
    auto n = get<uint32_t>();
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), bytes(n * sizeof(T)), n * sizeof(T));
    return v;
  }
  size_t remaining() const { return n_ - o_; }

 private:
  const uint8_t* p_;
  size_t n_, o_ = 0;
};

// Object ids: a run's outputs are (run id << 16 | output index), so that a run message need not
// carry them; a client's put takes a run id of its own.
inline uint64_t output_object_id(uint64_t run_id, uint32_t index) { return (run_id << 16) | index; }

// kRunTrace: report node starts and ends (deadlines); kRunUnordered: no island order (gang
// nodes start when ready: the deadlock demonstration); kRunRecord: record kernel executions for
// the Perfetto trace.
// kRunAwaited: a client was waiting for the run's outputs when it was sent (the worker sends
// its run_done before starting another kernel).
enum RunFlags : uint8_t { kRunSequential = 1, kRunTrace = 2, kRunUnordered = 4, kRunRecord = 8, kRunAwaited = 16 };

// One kernel execution on a worker, for the Perfetto trace (sent in kTrace at shutdown).
struct TraceRecord {
  uint64_t run_id = 0, program_id = 0, owner = 0;
  uint32_t node = 0;
  int32_t shard = 0;
  double t0 = 0, t1 = 0;  // now_s() on the worker
};

struct RunHeader {
  uint64_t run_id = 0, program_id = 0, owner = 0;
  uint32_t xfer_base = 0;  // the run's first data tag: transfer x uses tags::data_tag(xfer_base, x)
  uint8_t flags = 0;
  std::vector<uint64_t> inputs;  // object id per program parameter

  std::vector<uint8_t> encode() const {
    Writer w;
    w.put(run_id);
    w.put(program_id);
    w.put(owner);
    w.put(xfer_base);
    w.put(flags);
    w.vec(inputs);
    return w.take();
  }
  static RunHeader decode(Reader& r) {
    RunHeader h;
    h.run_id = r.get<uint64_t>();
    h.program_id = r.get<uint64_t>();
    h.owner = r.get<uint64_t>();
    h.xfer_base = r.get<uint32_t>();
    h.flags = r.get<uint8_t>();
    h.inputs = r.vec<uint64_t>();
    return h;
  }
};

// What a worker holds, for tests and the benchmark's leak check.
struct WorkerStats {
  int32_t rank = 0;
  uint64_t objects = 0;   // object-store entries
  uint64_t buffers = 0;   // live buffers (store entries, run slots, transfers in flight)
  uint64_t bytes = 0;     // their bytes
  uint64_t programs = 0;  // cached lowered programs
  uint64_t runs = 0;      // runs in progress
  uint64_t kernels_run = 0;
  uint64_t waiting_runs = 0;  // runs held back because their buffers do not fit the memory cap
  uint64_t memory_cap = 0;    // bytes, 0 = none
  uint64_t peak_bytes = 0;    // the most bytes of live buffers seen at a run's admission
};

struct Message {
  int peer = -1;
  MsgType type{};
  std::vector<uint8_t> body;
};

class Channel {
 public:
  static constexpr size_t kInlineBytes = 16 << 10;

  explicit Channel(collectives::Transport& t);
  ~Channel();

  // Keep a receive posted from `peer` (reposted after each frame until a final frame arrives).
  void listen(int peer);
  // Append a message to `peer`'s pending bundle (sent by the next flush()).
  void post(int peer, MsgType type, const std::vector<uint8_t>& body);
  void post(int peer, MsgType type) { post(peer, type, {}); }
  // The next frame to `peer` is its last: the receiver does not repost its receive, so that no
  // receive is left posted at MPI_Finalize. Nothing may be posted to `peer` afterwards.
  void close(int peer);
  // Sends every non-empty bundle. Returns true if anything was sent.
  bool flush();
  // Tests in-flight sends and receives; appends complete messages, in arrival order per peer,
  // to `inbox`. Returns true if anything completed.
  bool progress(std::vector<Message>& inbox);
  size_t sends_in_flight() const { return sends_.size(); }
  bool listening(int peer) const;

 private:
  struct Peer;
  struct Send {
    collectives::Request req;
    std::shared_ptr<std::vector<uint8_t>> buf;
  };
  Peer& peer(int p);
  void post_header_recv(int p, Peer& s);
  void deliver(int p, const uint8_t* data, size_t n, std::vector<Message>& inbox);
  void send_frame(int p, std::vector<uint8_t>&& frame, bool final);

  collectives::Transport& t_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  std::deque<Send> sends_;
};

}  // namespace pwm::pathways
