// The controller <-> worker messages (docs/pathways.md, "Wire protocol"): one struct per message
// type, its write() and read() side by side, so that both ends of the protocol use one codec.
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
#include <vector>

#include "pathways/kernel.h"
#include "pathways/wire.h"
#include "pathways/worker_stats.h"

namespace pwm::pathways {

// Wire form of a tensor spec: u8 data type, vector<i64> shape (checked when read).
void write_spec(Writer& w, const TensorSpec& s);
TensorSpec read_spec(Reader& r);

// ---- controller -> worker ----
// (kLoadProgram's payload is a WorkerProgram; its codec is WorkerProgram::write/read, lowering.h.)

struct EvictProgram {
  static constexpr MsgType kType = MsgType::kEvictProgram;
  uint64_t program_id = 0;
  void write(Writer& w) const { w.put(program_id); }
  static EvictProgram read(Reader& r) { return {r.get<uint64_t>()}; }
  bool operator==(const EvictProgram&) const = default;
};

// kRunTrace: report node starts and ends (deadlines); kRunUnordered: no island order (gang
// nodes start when ready: the deadlock demonstration); kRunRecord: record kernel executions for
// the Perfetto trace; kRunAwaited: a client was waiting for the run's outputs when it was sent
// (the worker sends its run_done before starting another kernel).
enum RunFlags : uint8_t { kRunSequential = 1, kRunTrace = 2, kRunUnordered = 4, kRunRecord = 8, kRunAwaited = 16 };

// kRun. The outputs are output_object_id(run_id, k) (object_id.h): the message need not carry them.
struct RunHeader {
  static constexpr MsgType kType = MsgType::kRun;
  uint64_t run_id = 0, program_id = 0, owner = 0;
  uint8_t flags = 0;
  std::vector<uint64_t> inputs;  // object id per program parameter
  void write(Writer& w) const {
    w.put(run_id);
    w.put(program_id);
    w.put(owner);
    w.put(flags);
    w.vec(inputs);
  }
  static RunHeader read(Reader& r) {
    RunHeader h;
    h.run_id = r.get<uint64_t>();
    h.program_id = r.get<uint64_t>();
    h.owner = r.get<uint64_t>();
    h.flags = r.get<uint8_t>();
    h.inputs = r.vec<uint64_t>();
    return h;
  }
  bool operator==(const RunHeader&) const = default;
};

// kReleaseStage (sequential dispatch) and its answer kStageDone carry the same fields.
struct StageMsg {
  uint64_t run_id = 0;
  uint32_t stage = 0;
  void write(Writer& w) const {
    w.put(run_id);
    w.put(stage);
  }
  bool operator==(const StageMsg&) const = default;
};
struct ReleaseStage : StageMsg {
  static constexpr MsgType kType = MsgType::kReleaseStage;
  static ReleaseStage read(Reader& r) { return {{r.get<uint64_t>(), r.get<uint32_t>()}}; }
};

// kPut: one shard of a client's value.
struct PutShard {
  static constexpr MsgType kType = MsgType::kPut;
  uint64_t object = 0, owner = 0;
  TensorSpec spec;
  std::span<const uint8_t> bytes;  // spec.bytes() of them
  void write(Writer& w) const;
  static PutShard read(Reader& r);
};

// kFetch: send the shard of `object` back, answered by a FetchReply with the same request.
struct Fetch {
  static constexpr MsgType kType = MsgType::kFetch;
  uint64_t request = 0, object = 0;
  void write(Writer& w) const {
    w.put(request);
    w.put(object);
  }
  static Fetch read(Reader& r) { return {r.get<uint64_t>(), r.get<uint64_t>()}; }
  bool operator==(const Fetch&) const = default;
};

struct Free {
  static constexpr MsgType kType = MsgType::kFree;
  std::vector<uint64_t> objects;
  void write(Writer& w) const { w.vec(objects); }
  static Free read(Reader& r) { return {r.vec<uint64_t>()}; }
  bool operator==(const Free&) const = default;
};

struct FreeOwner {
  static constexpr MsgType kType = MsgType::kFreeOwner;
  uint64_t owner = 0;
  void write(Writer& w) const { w.put(owner); }
  static FreeOwner read(Reader& r) { return {r.get<uint64_t>()}; }
  bool operator==(const FreeOwner&) const = default;
};

// A drain's migration: the old device sends the object to `to` on `tag`...
struct MoveOut {
  static constexpr MsgType kType = MsgType::kMoveOut;
  uint64_t object = 0;
  int32_t to = 0, tag = 0;
  void write(Writer& w) const {
    w.put(object);
    w.put(to);
    w.put(tag);
  }
  static MoveOut read(Reader& r) { return {r.get<uint64_t>(), r.get<int32_t>(), r.get<int32_t>()}; }
  bool operator==(const MoveOut&) const = default;
};

// ... and the new device enters it (pending) and receives it from `from` on the same tag.
struct MoveIn {
  static constexpr MsgType kType = MsgType::kMoveIn;
  uint64_t object = 0, owner = 0;
  TensorSpec spec;
  int32_t from = 0, tag = 0;
  void write(Writer& w) const;
  static MoveIn read(Reader& r);
  bool operator==(const MoveIn&) const = default;
};

struct StatsRequest {
  static constexpr MsgType kType = MsgType::kStats;
  uint64_t request = 0;
  void write(Writer& w) const { w.put(request); }
  static StatsRequest read(Reader& r) { return {r.get<uint64_t>()}; }
  bool operator==(const StatsRequest&) const = default;
};

// kShutdown and kBye have no payload: Channel::post(peer, type).

// ---- worker -> controller ----

struct Hello {
  static constexpr MsgType kType = MsgType::kHello;
  std::string host;         // islands by host
  uint64_t memory_cap = 0;  // WorkerOptions::memory_cap_bytes (0 = none)
  void write(Writer& w) const {
    w.str(host);
    w.put(memory_cap);
  }
  static Hello read(Reader& r) {
    Hello h;
    h.host = r.str();
    h.memory_cap = r.get<uint64_t>();
    return h;
  }
  bool operator==(const Hello&) const = default;
};

struct RunDone {
  static constexpr MsgType kType = MsgType::kRunDone;
  uint64_t run_id = 0;
  std::string error;    // the first error on this worker ("" = ok)
  double kernel_s = 0;  // summed kernel durations on this worker
  void write(Writer& w) const {
    w.put(run_id);
    w.str(error);
    w.put(kernel_s);
  }
  static RunDone read(Reader& r) {
    RunDone d;
    d.run_id = r.get<uint64_t>();
    d.error = r.str();
    d.kernel_s = r.get<double>();
    return d;
  }
  bool operator==(const RunDone&) const = default;
};

struct StageDone : StageMsg {
  static constexpr MsgType kType = MsgType::kStageDone;
  static StageDone read(Reader& r) { return {{r.get<uint64_t>(), r.get<uint32_t>()}}; }
};

// Node starts and ends of runs with a deadline (kRunTrace).
struct NodeEvent {
  static constexpr MsgType kType = MsgType::kNodeEvent;
  uint64_t run_id = 0;
  uint32_t node = 0;
  bool started = false;  // false: finished
  void write(Writer& w) const {
    w.put(run_id);
    w.put(node);
    w.put<uint8_t>(started);
  }
  static NodeEvent read(Reader& r) { return {r.get<uint64_t>(), r.get<uint32_t>(), r.get<uint8_t>() != 0}; }
  bool operator==(const NodeEvent&) const = default;
};

struct FetchReply {
  static constexpr MsgType kType = MsgType::kFetchReply;
  uint64_t request = 0;
  std::string error;               // "" = ok
  std::span<const uint8_t> bytes;  // the shard (empty on error)
  void write(Writer& w) const;
  static FetchReply read(Reader& r);
};

struct StatsReply {
  static constexpr MsgType kType = MsgType::kStatsReply;
  uint64_t request = 0;
  WorkerStats stats;
  void write(Writer& w) const {
    w.put(request);
    w.put(stats);
  }
  static StatsReply read(Reader& r) { return {r.get<uint64_t>(), r.get<WorkerStats>()}; }
};

// One kernel execution on a worker, for the Perfetto trace.
struct TraceRecord {
  uint64_t run_id = 0, program_id = 0, owner = 0;
  uint32_t node = 0;
  int32_t shard = 0;
  double t0 = 0, t1 = 0;  // now_s() on the worker
  bool operator==(const TraceRecord&) const = default;
};

// kTrace: every kernel execution recorded, sent once just before bye.
struct TraceRecords {
  static constexpr MsgType kType = MsgType::kTrace;
  std::vector<TraceRecord> records;
  void write(Writer& w) const { w.vec(records); }
  static TraceRecords read(Reader& r) { return {r.vec<TraceRecord>()}; }
  bool operator==(const TraceRecords&) const = default;
};

// ---- whole messages ----

template <typename M>
std::vector<uint8_t> encode(const M& m) {
  Writer w;
  m.write(w);
  return w.take();
}

template <typename M>
M decode(const uint8_t* p, size_t n) {
  Reader r(p, n);
  M m = M::read(r);
  r.expect_end(msg_type_name(M::kType));
  return m;
}
template <typename M>
M decode(const std::vector<uint8_t>& body) {
  return decode<M>(body.data(), body.size());
}

}  // namespace pwm::pathways
