// Lowering: a ProgramDef on virtual slices -> one instruction list per device (docs/dataflow.md).
//
// Done once per program and slice mapping. Both MPMD models use it: the single controller lowers
// and sends each worker its list (pathways' kLoadProgram, cached under the program id, so that a
// run sends only ids and handles); in the static model every rank lowers the same program with
// the same mapping and keeps its own list. The instructions of a device:
//   kRecv  receive `bytes` bytes from world rank `peer` into slot[offset..]  (transfer `xfer`)
//   kSend  send slot[offset..offset+bytes) to world rank `peer`             (transfer `xfer`)
//   kCopy  copy between two slots of this worker (a reshard that stays on one device)
//   kExec  run one shard of a node: kernel, attributes, input and output slots
// A slot is one buffer of a static spec, allocated when a run starts. An edge between values on
// the same devices with the same sharding is no instruction at all (the consumer reads the
// producer's slot); any other edge becomes M-to-N pieces, each a contiguous byte range of a
// source shard and of a destination shard (sharding splits dimension 0 of row-major tensors).
// Every instruction carries a stage, the index of the node it feeds or runs: parallel dispatch
// releases all stages at once, sequential dispatch one after the other. Instructions are in
// program order (a node's transfers, then the node), the same order on every device: a device
// that runs its list front to back, posting sends and receives as it meets them, matches every
// peer's list (the static model's order, docs/static_mpmd.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dataflow/program.h"

namespace pwm::dataflow {

// A program has at most this many transfers (the runtimes give each transfer of a run its own tag).
constexpr uint32_t kMaxTransfersPerProgram = 4096;

enum class Op : uint8_t { kRecv, kSend, kCopy, kExec };

struct Instr {
  Op op = Op::kExec;
  uint32_t stage = 0;
  int32_t slot = -1;   // recv: destination, send: source, copy: source
  int32_t slot2 = -1;  // copy: destination
  uint64_t offset = 0, offset2 = 0, bytes = 0;
  int32_t peer = -1;   // world rank
  uint32_t xfer = 0;
  int32_t exec = -1;   // kExec: index into WorkerProgram::execs
};

struct ExecInfo {
  uint32_t node = 0;
  std::string kernel;
  std::vector<int64_t> attrs;
  int32_t shard = 0, num_shards = 1;
  uint32_t context = 0;            // slice communicator context
  std::vector<int32_t> group;      // slice world ranks, shard order
  bool collectives = false;
  std::vector<int32_t> ins, outs;  // slots
};

struct SlotBinding {
  uint32_t index = 0;  // parameter or output index
  int32_t slot = -1;
};

// One worker's part of a program: what the single controller sends it (pathways' kLoadProgram
// carries it) and what a rank of the static model keeps for itself.
struct WorkerProgram {
  uint64_t id = 0;
  std::string name;
  std::vector<TensorSpec> slots;
  std::vector<uint32_t> slot_writers;  // instructions writing each slot (0: bound to an input)
  std::vector<SlotBinding> params;   // parameter index -> slot
  std::vector<SlotBinding> outputs;  // output index -> slot
  std::vector<Instr> instrs;   // in program order: a node's transfers, then the node
  std::vector<ExecInfo> execs;
  uint32_t num_stages = 0;

  // Bytes a run allocates on this worker (every slot not bound to an input).
  uint64_t buffer_bytes() const;
};

// The physical mapping of a virtual slice at lowering time.
struct SliceMapping {
  std::vector<int> ranks;  // world ranks, shard order
  uint32_t context = 0;
  uint64_t generation = 0;
  int island = 0;
};
using SliceLookup = std::function<SliceMapping(int slice_id)>;

struct OutputPlacement {
  int slice = 0;
  ArgSpec spec;
  std::vector<int> ranks;
};

struct LoweredProgram {
  uint64_t id = 0;
  std::string name;
  std::map<int, WorkerProgram> workers;         // by world rank
  std::vector<std::set<int>> stage_ranks;       // per stage, ranks with instructions in it
  std::vector<OutputPlacement> outputs;
  std::vector<std::vector<int>> node_ranks;     // per node, the world rank of each shard
  std::map<int, uint64_t> generations;          // slice id -> generation lowered for
  std::set<int> islands;
  uint32_t transfers = 0;
  // Filled by the dispatcher: kernel executions (node-shards) per island and in all, the cost of
  // one run for the island schedulers and the usage counters.
  std::map<int, int> island_execs;
  int execs = 0;

  std::vector<int> ranks() const;
  // For a deadline report: where node `n`'s shard on `rank` gets its inputs from.
  std::string describe_wait(int rank, uint32_t node) const;
};

// Throws pwm::Error for a program that cannot be lowered (its recorded error, or too many
// transfers).
LoweredProgram lower(const ProgramDef& def, uint64_t id, const SliceLookup& lookup);

}  // namespace pwm::dataflow
