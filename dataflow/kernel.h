// Compiled functions: kernels registered by name on every rank, with static shapes.
//
// A kernel is the unit of work of a program node, like an XLA computation: it runs once per
// shard of the node's slice, on the device holding that shard, over preallocated input and
// output buffers of static per-shard shapes. A kernel declared with `collectives = true` may run
// collectives over its slice through KernelContext::comm() (every shard must then call the same
// collectives in the same order, as in SPMD code). Pathways gang-schedules such a node per island
// (docs/pathways.md); the static model runs every device's kernels in the one program order
// (docs/static_mpmd.md). A kernel without it must not communicate.
//
// Registration: every rank registers the same kernels before it builds or runs a program (in
// pathways, before the Runtime on rank 0 or run_worker on the others start); the signatures
// check and lower programs, the devices run the functions. A kernel that throws fails its node
// (pathways: the client's futures for that run fail with the message and the runtime keeps
// running; the static model: the rank reports it and the job ends). A kernel with collectives
// must throw on all of its shards before its first collective or after its last, or the shards
// that did not throw wait in the collective until its watchdog ends the job.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/types.h"
#include "common/check.h"

namespace pwm::dataflow {

using collectives::DataType;

struct TensorSpec {
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // empty = scalar

  int64_t elements() const;
  size_t bytes() const;
  std::string str() const;  // "float32[4,8]"
  bool operator==(const TensorSpec&) const = default;
};

// How a logical tensor lies on the devices of a slice: split into equal blocks along dimension 0
// (shard k holds rows [k*r, (k+1)*r)), or a full copy on every device.
enum class Sharding : uint8_t { kSplit, kReplicated };
const char* sharding_name(Sharding s);

// One input or output of a kernel: its per-shard spec and how the shards make the logical tensor.
struct ArgSpec {
  TensorSpec shard;
  Sharding sharding = Sharding::kReplicated;
  // Its reader uses only the prefix of each transfer its writer declared (KernelContext::set_used):
  // a receive into it may be shorter than the transfer's static size.
  bool prefix = false;

  // The logical tensor on `num_shards` devices (dim 0 times num_shards when split).
  TensorSpec logical(int num_shards) const;
  std::string str(int num_shards) const;  // "float32[4,8] split x2 (logical [8,8])"
  bool operator==(const ArgSpec&) const = default;
};

struct Signature {
  std::vector<ArgSpec> inputs, outputs;
  // Per output (or empty: none): the input whose buffer it may take, or -1. Declared by a kernel
  // that reads element i of that input before it writes element i of the output and reads no
  // other element of the input after that (AdamW's update: the state in, the next state out).
  // The walk then hands the input's buffer to the output when the input dies at this node and
  // nothing else holds it (a donated value: Walk::donated_bytes), so the kernel runs in place.
  std::vector<int32_t> reuse = {};
};

// A slice's collectives context c (its gang communicator, KernelContext::comm) comes with the
// next kSliceSubContexts contexts, c + 1 .. c + kSliceSubContexts, for its kernels' sub-groups
// (programs/device.cc: tp, dp, expert-parallel, experts). Whoever hands out slice contexts
// spaces them kSliceContextStride apart, so that a slice given a fresh context (a remap, or
// collectives abandoned after a loss) has fresh sub-groups too.
constexpr uint32_t kSliceSubContexts = 4;
constexpr uint32_t kSliceContextStride = 1 + kSliceSubContexts;

// What a running kernel sees. Valid during the call only.
class KernelContext {
 public:
  struct Buffer {
    void* data;
    const TensorSpec* spec;
  };
  KernelContext(int shard, int num_shards, int world_rank, std::span<const int64_t> attrs,
                std::vector<Buffer> inputs, std::vector<Buffer> outputs,
                collectives::Communicator* comm, const std::string* kernel_name);

  int shard() const { return shard_; }            // this shard's index in the slice
  int num_shards() const { return num_shards_; }  // the slice's size
  int world_rank() const { return world_rank_; }
  std::span<const int64_t> attrs() const { return attrs_; }
  int64_t attr(size_t i) const;  // throws naming the kernel when absent
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  const TensorSpec& input_spec(size_t i) const { return *inputs_.at(i).spec; }
  const TensorSpec& output_spec(size_t i) const { return *outputs_.at(i).spec; }

  template <typename T>
  std::span<const T> in(size_t i) const {
    check_type(inputs_.at(i), collectives::dtype_of<T>(), "input", i);
    return {static_cast<const T*>(inputs_[i].data), static_cast<size_t>(inputs_[i].spec->elements())};
  }
  template <typename T>
  std::span<T> out(size_t i) {
    check_type(outputs_.at(i), collectives::dtype_of<T>(), "output", i);
    return {static_cast<T*>(outputs_[i].data), static_cast<size_t>(outputs_[i].spec->elements())};
  }
  const void* in_raw(size_t i) const { return inputs_.at(i).data; }
  void* out_raw(size_t i) { return outputs_.at(i).data; }
  // Declares that readers need only the first used[k] bytes of each piece of output `i` (pieces
  // of `piece_bytes`; one piece: the whole output): sends of whole pieces carry that prefix, to
  // a reader whose ArgSpec is `prefix`. The bytes beyond must still be written (Buffer).
  void set_used(size_t i, uint64_t piece_bytes, std::vector<uint64_t> used);
  struct Used {
    uint64_t piece_bytes = 0;
    std::vector<uint64_t> used;
  };
  const std::vector<Used>& used() const { return used_; }  // per output: empty when not declared
  // The slice's communicator (its world ranks in shard order, the slice's own context id).
  // Only for kernels registered with collectives = true.
  collectives::Communicator& comm();

 private:
  void check_type(const Buffer& b, DataType want, const char* what, size_t i) const;
  int shard_, num_shards_, world_rank_;
  std::span<const int64_t> attrs_;
  std::vector<Buffer> inputs_, outputs_;
  std::vector<Used> used_;
  collectives::Communicator* comm_;
  const std::string* name_;
};

using KernelFn = std::function<void(KernelContext&)>;
// Shapes may depend on the node's static attributes and its slice size; they are fixed once a
// node is built (the attributes are part of the program).
using SignatureFn = std::function<Signature(std::span<const int64_t> attrs, int num_shards)>;

struct KernelDef {
  std::string name;
  bool collectives = false;  // runs collectives over its slice: gang-scheduled
  SignatureFn signature;
  KernelFn fn;
};

// Kernels by name. Thread-safe; registration normally happens once at start-up.
class KernelRegistry {
 public:
  static KernelRegistry& global();
  // Throws when the name is already taken.
  void add(KernelDef def);
  // Convenience for a fixed signature.
  void add(std::string name, Signature sig, KernelFn fn, bool collectives = false);
  // nullptr when unknown. The pointer stays valid for the registry's lifetime.
  const KernelDef* find(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<KernelDef>> defs_;
};

}  // namespace pwm::dataflow
