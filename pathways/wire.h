// The controller <-> worker wire protocol: message types, a byte writer/reader, and the framed
// Channel that carries them over the collectives' Transport (docs/pathways_wire.md,
// "Wire protocol"). The payload of each message type has one codec, in messages.h. Internal: not
// part of the client API (client.h does not include it).
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

// The payload of each type is the messages.h struct named beside it (its codec).
enum class MsgType : uint32_t {
  // controller -> worker
  kLoadProgram = 1,   // LoadProgram (messages.h: a dataflow::WorkerProgram)
  kEvictProgram = 2,  // EvictProgram
  kRun = 3,           // RunHeader
  kReleaseStage = 4,  // ReleaseStage (sequential dispatch)
  kPut = 5,           // PutShard
  kFetch = 6,         // Fetch
  kFree = 7,          // Free
  kFreeOwner = 8,     // FreeOwner
  kMoveOut = 9,       // MoveOut (drain)
  kMoveIn = 10,       // MoveIn (drain)
  kStats = 11,        // StatsRequest
  kShutdown = 12,     // Shutdown
  kCancelRun = 13,    // CancelRun (a device of the run was lost)
  kEvict = 14,        // Evict (this worker was declared lost: it leaves the job)
  kCountContext = 15, // CountContext (a retired context block: report its traffic)
  kDrainContext = 16, // DrainContext (take what is left of it, then forget it)
  // worker -> controller
  kHello = 32,       // Hello
  kRunDone = 33,     // RunDone
  kStageDone = 34,   // StageDone
  kNodeEvent = 35,   // NodeEvent
  kFetchReply = 36,  // FetchReply
  kStatsReply = 37,  // StatsReply
  kBye = 38,         // -
  kTrace = 39,       // TraceRecords (before bye)
  kContextCount = 41,    // ContextCount (the answer to count_context)
  kContextDrained = 42,  // ContextDrained (the answer to drain_context)
  // both directions
  kHeartbeat = 40,   // - (liveness.h: every quarter of the timeout)
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
    const size_t o = buf_.size();
    PWM_CHECK_LE(n, buf_.max_size() - o);  // (also tells the compiler the copy is bounded)
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
  // Overwrites bytes written before (a length known only after its payload).
  template <typename T>
  void patch(size_t at, const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    PWM_CHECK_LE(at + sizeof(T), buf_.size());
    std::memcpy(buf_.data() + at, &v, sizeof(T));
  }
  std::vector<uint8_t> take() { return std::move(buf_); }
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t> buf_;
};

// Reads what a Writer wrote; a short or malformed message throws pwm::Error (never reads past
// the end, never allocates more than the message holds).
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
    const uint8_t* p = bytes(size_t{n} * sizeof(T));  // checked before allocating: a garbled length throws
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p, size_t{n} * sizeof(T));
    return v;
  }
  size_t remaining() const { return n_ - o_; }
  // A u32 element count, checked against the bytes left (each element takes at least
  // `min_bytes` of them): a garbled count throws instead of allocating.
  size_t count(size_t min_bytes) {
    const auto n = get<uint32_t>();
    if (size_t{n} * min_bytes > remaining())
      PWM_THROW("pathways wire: message truncated ({} elements of >= {} bytes, {} bytes left)", n, min_bytes, remaining());
    return n;
  }
  // Throws unless every byte was read: `what` names the message.
  void expect_end(const char* what) const {
    if (o_ != n_) PWM_THROW("pathways wire: {} message has {} bytes after its end (of {})", what, n_ - o_, n_);
  }

 private:
  const uint8_t* p_;
  size_t n_, o_ = 0;
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
  // Appends message `m` (a struct of messages.h) encoded straight into the bundle.
  template <typename M>
  void send(int peer, const M& m) {
    const size_t at = begin_message(peer, M::kType);
    write_message(bundle(peer), m);  // (messages.h)
    end_message(peer, at);
  }
  // The next frame to `peer` is its last: the receiver does not repost its receive, so that no
  // receive is left posted at MPI_Finalize. Nothing may be posted to `peer` afterwards.
  void close(int peer);
  // Sends every non-empty bundle. Returns true if anything was sent.
  bool flush();
  // Tests in-flight sends and receives; appends complete messages, in arrival order per peer,
  // to `inbox`. Returns true if anything completed.
  bool progress(std::vector<Message>& inbox);
  // `peer` was lost (its process is gone): nothing more is sent to it or received from it, and
  // the frames in flight to it stop counting as in flight (their buffers and requests are kept
  // for as long as the channel lives: MPI may still hold them).
  void drop(int peer);
  size_t sends_in_flight() const { return sends_.size(); }
  bool listening(int peer) const;
  const collectives::Transport& transport() const { return t_; }

 private:
  struct Peer;
  struct Send {
    collectives::Request req;
    std::shared_ptr<std::vector<uint8_t>> buf;
    int peer = 0;
  };
  Peer& peer(int p);
  Writer& bundle(int p);
  size_t begin_message(int p, MsgType type);  // returns where its length goes
  void end_message(int p, size_t at);
  void post_header_recv(int p, Peer& s);
  void deliver(int p, const uint8_t* data, size_t n, std::vector<Message>& inbox);
  void send_frame(int p, std::vector<uint8_t>&& frame, bool final);

  collectives::Transport& t_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  std::deque<Send> sends_;
  std::vector<Send> dropped_;  // frames to lost peers (drop())
};

}  // namespace pwm::pathways
