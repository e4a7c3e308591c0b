// The controller <-> worker messages (docs/pathways_wire.md, "Wire protocol"): one struct per
// message type, its write() and read() side by side, so that both ends of the protocol use one
// codec.
//
//   chan.send(worker, Fetch{req, object});                  // encodes straight into the bundle
//   case MsgType::kFetch: { auto f = decode<Fetch>(m.body); ... }
//
// decode<M>() reads a whole message body: a truncated, garbled (a bad data type, a negative
// dimension, a length beyond the body) or over-long body throws pwm::Error naming the message;
// nothing is read out of bounds. Fields that are byte views (PutShard::bytes,
// FetchReply::bytes) point into the decoded body and live as long as it does. The shard bytes
// are written once, into the bundle; decoding them copies nothing.
// Worker-to-worker traffic is raw shard bytes and has no codec (both sides know the sizes).
// Pure data and functions: any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/wire.h"
#include "pathways/worker_stats.h"

namespace pwm::pathways {

// Wire form of a tensor spec: u8 data type, vector<i64> shape (checked when read).
void write_spec(Writer& w, const dataflow::TensorSpec& s);
dataflow::TensorSpec read_spec(Reader& r);

// Most messages list their fields once, in wire order (`fields(m)`, a tuple of references), and
// the codec below writes and reads that list: encoder and decoder cannot disagree. Field
// types: trivially copyable values (as their bytes), bool (u8), std::string, std::vector of
// trivially copyable values (u32 count, then the elements) and TensorSpec (write_spec).
// Messages with a byte view (PutShard, FetchReply) or a richer layout (LoadProgram) have their
// own write() and read() instead.
namespace codec {
inline void put(Writer& w, bool v) { w.put<uint8_t>(v); }
inline void put(Writer& w, const std::string& s) { w.str(s); }
inline void put(Writer& w, const dataflow::TensorSpec& s) { write_spec(w, s); }
template <typename T>
void put(Writer& w, const std::vector<T>& v) {
  w.vec(v);
}
template <typename T>
  requires std::is_trivially_copyable_v<T>
void put(Writer& w, const T& v) {
  w.put(v);
}
inline void get(Reader& r, bool& v) { v = r.get<uint8_t>() != 0; }
inline void get(Reader& r, std::string& s) { s = r.str(); }
inline void get(Reader& r, dataflow::TensorSpec& s) { s = read_spec(r); }
template <typename T>
void get(Reader& r, std::vector<T>& v) {
  v = r.vec<T>();
}
template <typename T>
  requires std::is_trivially_copyable_v<T>
void get(Reader& r, T& v) {
  v = r.get<T>();
}
}  // namespace codec

template <typename M>
concept FieldListed = requires(M& m) { M::fields(m); };

template <typename M>
void write_message(Writer& w, const M& m) {
  if constexpr (FieldListed<M>)
    std::apply([&](const auto&... f) { (codec::put(w, f), ...); }, M::fields(m));
  else
    m.write(w);
}

template <typename M>
M read_message(Reader& r) {
  if constexpr (FieldListed<M>) {
    M m;
    std::apply([&](auto&... f) { (codec::get(r, f), ...); }, M::fields(m));  // (left to right)
    return m;
  } else {
    return M::read(r);
  }
}

// ---- controller -> worker ----
// A worker's instruction list (dataflow/lowering.h), cached under its id.
struct LoadProgram : dataflow::WorkerProgram {
  static constexpr MsgType kType = MsgType::kLoadProgram;
  void write(Writer& w) const;
  static LoadProgram read(Reader& r);
};

struct EvictProgram {
  static constexpr MsgType kType = MsgType::kEvictProgram;
  uint64_t program_id = 0;
  static auto fields(auto& m) { return std::tie(m.program_id); }
};

// Another device of the run was lost (RuntimeOptions::survive_worker_loss): the worker stops
// the run where it is and answers run_done with `reason`.
struct CancelRun {
  static constexpr MsgType kType = MsgType::kCancelRun;
  uint64_t run_id = 0;
  std::string reason;
  static auto fields(auto& m) { return std::tie(m.run_id, m.reason); }
};

// The controller declared this worker lost (silent past the liveness timeout) and moved its
// slices away: a worker that was only stopped or cut off, and hears this once it runs again,
// leaves the job with one line instead of ending it through its own liveness (the controller,
// which dropped it, is silent to it). The last frame the controller sends it.
struct Evict {
  static constexpr MsgType kType = MsgType::kEvict;
  std::string reason;
  static auto fields(auto& m) { return std::tie(m.reason); }
};

// Reclaiming a retired context block (docs/pathways_liveness.md, "Reclaiming a context").
// count_context: once no run of this worker uses the block any more (its runs of the slice
// finished or were cancelled), answer context_count with what its collectives sent and received
// on each context of the block (Transport::traffic), per world rank.
struct CountContext {
  static constexpr MsgType kType = MsgType::kCountContext;
  uint32_t context = 0;  // the block's first context (dataflow::kSliceContextStride of them)
  static auto fields(auto& m) { return std::tie(m.context); }
};

// How many messages of `context` from world rank `peer` are still to be taken.
struct DrainCount {
  uint32_t context = 0;
  int32_t peer = 0;
  uint64_t count = 0;
  bool operator==(const DrainCount&) const = default;
};

// drain_context: take `counts` (collectives::ContextDrain; counts of 0 are nothing to take),
// then drop every communicator on the block (a reused context starts its sequence numbers at
// 0) and answer context_drained. With `give_up`, sent after the first for a block, the counts'
// peers were lost since: nothing more is taken from them (their messages may never come); a
// worker that has finished the block's drain ignores it.
struct DrainContext {
  static constexpr MsgType kType = MsgType::kDrainContext;
  uint32_t context = 0;  // the block's first context
  std::vector<DrainCount> counts;
  bool give_up = false;
  static auto fields(auto& m) { return std::tie(m.context, m.counts, m.give_up); }
};

// kRunTrace: report node starts and ends (deadlines); kRunUnordered: no island order (gang
// nodes start when ready: the deadlock demonstration); kRunRecord: record kernel executions for
// the Perfetto trace; kRunAwaited: a client was waiting for the run's outputs when it was sent
// (the worker sends its run_done before starting another kernel); kRunInOrder: each worker runs
// the run's kernels strictly in its instruction order (a pipeline schedule; worker.h).
enum RunFlags : uint8_t {
  kRunSequential = 1, kRunTrace = 2, kRunUnordered = 4, kRunRecord = 8, kRunAwaited = 16, kRunInOrder = 32
};

// kRun. The outputs are output_object_id(run_id, k) (object_id.h): the message need not carry them.
struct RunHeader {
  static constexpr MsgType kType = MsgType::kRun;
  uint64_t run_id = 0, program_id = 0, owner = 0;
  uint32_t xfer_base = 0;  // the run's first data tag: transfer x uses tags::data_tag(xfer_base, x)
  uint8_t flags = 0;
  std::vector<uint64_t> inputs;  // object id per program parameter
  std::vector<uint64_t> donated;  // inputs the store lets go of when the run takes them (RunOptions::donate)
  static auto fields(auto& m) {
    return std::tie(m.run_id, m.program_id, m.owner, m.xfer_base, m.flags, m.inputs, m.donated);
  }
};

// kReleaseStage (sequential dispatch) and its answer kStageDone.
template <MsgType T>
struct StageMsg {
  static constexpr MsgType kType = T;
  uint64_t run_id = 0;
  uint32_t stage = 0;
  static auto fields(auto& m) { return std::tie(m.run_id, m.stage); }
};
using ReleaseStage = StageMsg<MsgType::kReleaseStage>;

// kPut: one shard of a client's value.
struct PutShard {
  static constexpr MsgType kType = MsgType::kPut;
  uint64_t object = 0, owner = 0;
  dataflow::TensorSpec spec;
  std::span<const uint8_t> bytes;  // spec.bytes() of them
  void write(Writer& w) const;
  static PutShard read(Reader& r);
};

// kFetch: send the shard of `object` back, answered by a FetchReply with the same request.
struct Fetch {
  static constexpr MsgType kType = MsgType::kFetch;
  uint64_t request = 0, object = 0;
  static auto fields(auto& m) { return std::tie(m.request, m.object); }
};

// The runtime's end; `lost`: the world ranks the controller lost on the way
// (RuntimeOptions::survive_worker_loss), which take no part in what the job does afterwards.
struct Shutdown {
  static constexpr MsgType kType = MsgType::kShutdown;
  std::vector<uint64_t> lost;
  static auto fields(auto& m) { return std::tie(m.lost); }
};

struct Free {
  static constexpr MsgType kType = MsgType::kFree;
  std::vector<uint64_t> objects;
  static auto fields(auto& m) { return std::tie(m.objects); }
};

struct FreeOwner {
  static constexpr MsgType kType = MsgType::kFreeOwner;
  uint64_t owner = 0;  // a client id
  static auto fields(auto& m) { return std::tie(m.owner); }
};

// A drain's migration: the old device sends the object to `to` on `tag`...
struct MoveOut {
  static constexpr MsgType kType = MsgType::kMoveOut;
  uint64_t object = 0;
  int32_t to = 0, tag = 0;
  static auto fields(auto& m) { return std::tie(m.object, m.to, m.tag); }
};

// ... and the new device enters it (pending) and receives it from `from` on the same tag.
struct MoveIn {
  static constexpr MsgType kType = MsgType::kMoveIn;
  uint64_t object = 0, owner = 0;
  dataflow::TensorSpec spec;
  int32_t from = 0, tag = 0;
  static auto fields(auto& m) { return std::tie(m.object, m.owner, m.spec, m.from, m.tag); }
};

struct StatsRequest {
  static constexpr MsgType kType = MsgType::kStats;
  uint64_t request = 0;
  static auto fields(auto& m) { return std::tie(m.request); }
};

// kShutdown and kBye have no payload: Channel::post(peer, type).

// ---- worker -> controller ----

struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  std::string host;         // islands by host
  uint64_t memory_cap = 0;  // WorkerOptions::memory_cap_bytes (0 = none)
  static auto fields(auto& m) { return std::tie(m.host, m.memory_cap); }
};

struct RunDone {
  static constexpr MsgType kType = MsgType::kRunDone;
  uint64_t run_id = 0;
  std::string error;    // the first error on this worker ("" = ok)
  double kernel_s = 0;  // summed kernel durations on this worker
  static auto fields(auto& m) { return std::tie(m.run_id, m.error, m.kernel_s); }
};

using StageDone = StageMsg<MsgType::kStageDone>;

// Node starts and ends of runs with a deadline (kRunTrace).
struct NodeEvent {
  static constexpr MsgType kType = MsgType::kNodeEvent;
  uint64_t run_id = 0;
  uint32_t node = 0;
  bool started = false;  // false: finished
  static auto fields(auto& m) { return std::tie(m.run_id, m.node, m.started); }
};

struct FetchReply {
  static constexpr MsgType kType = MsgType::kFetchReply;
  uint64_t request = 0;
  std::string error;               // "" = ok
  std::span<const uint8_t> bytes;  // the shard (empty on error): the rest of the message
  void write(Writer& w) const;
  static FetchReply read(Reader& r);
};

struct StatsReply {
  static constexpr MsgType kType = MsgType::kStatsReply;
  uint64_t request = 0;
  WorkerStats stats;
  static auto fields(auto& m) { return std::tie(m.request, m.stats); }
};

// One context's messages to and from one world rank, as this worker's collectives counted them.
struct ContextTraffic {
  uint32_t context = 0;
  int32_t peer = 0;
  uint64_t sent = 0, received = 0;
  bool operator==(const ContextTraffic&) const = default;
};

// The answer to count_context: every non-zero count on the block's contexts.
struct ContextCount {
  static constexpr MsgType kType = MsgType::kContextCount;
  uint32_t context = 0;  // the block's first context
  std::vector<ContextTraffic> traffic;
  static auto fields(auto& m) { return std::tie(m.context, m.traffic); }
};

// The answer to drain_context: nothing of the block can reach this worker any more, and it holds
// no communicator on it.
struct ContextDrained {
  static constexpr MsgType kType = MsgType::kContextDrained;
  uint32_t context = 0;
  static auto fields(auto& m) { return std::tie(m.context); }
};

// One kernel execution, or one worker-to-worker transfer, on a worker, for the Perfetto trace.
enum TraceKind : uint8_t { kTraceKernel = 0, kTraceSend = 1, kTraceRecv = 2 };
struct TraceRecord {
  uint64_t run_id = 0, program_id = 0, owner = 0;
  uint32_t node = 0;      // the node run, or the node a transfer feeds
  int32_t shard = 0;
  double t0 = 0, t1 = 0;  // now_s() on the worker: posted or started .. completed
  int32_t peer = -1;      // a transfer's other world rank
  uint32_t xfer = 0;      // a transfer's index in the lowered program (pairs a send with its receive)
  uint64_t bytes = 0;     // a transfer's size
  uint8_t kind = kTraceKernel;
  bool operator==(const TraceRecord&) const = default;
};

// kTrace: every kernel execution recorded, sent once just before bye.
struct TraceRecords {
  static constexpr MsgType kType = MsgType::kTrace;
  std::vector<TraceRecord> records;
  static auto fields(auto& m) { return std::tie(m.records); }
};

// ---- whole messages ----

template <typename M>
std::vector<uint8_t> encode(const M& m) {
  Writer w;
  write_message(w, m);
  return w.take();
}

template <typename M>
M decode(const uint8_t* p, size_t n) {
  Reader r(p, n);
  M m = read_message<M>(r);
  r.expect_end(msg_type_name(M::kType));
  return m;
}
template <typename M>
M decode(const std::vector<uint8_t>& body) {
  return decode<M>(body.data(), body.size());
}

}  // namespace pwm::pathways
