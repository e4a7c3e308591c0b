// A collective as a dependency graph of point-to-point and local steps (internal header).
//
// Every algorithm is written as a builder that emits a Schedule: sends, receives, reductions and
// copies, each listing the earlier steps it must wait for. One executor (executor.h) runs any
// schedule, blocking or non-blocking, so every algorithm gets progress, pipelining of segments,
// the watchdog and the fingerprint check for free (libNBC's schedules, with explicit
// dependencies instead of rounds).
//
// Matching rule: the executor posts the sends to one peer in schedule order, and the receives
// from one peer in schedule order. Builders therefore emit the messages between any two ranks in
// the same order on both sides; MPI's non-overtaking rule then pairs them correctly without
// per-message tags.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/types.h"

namespace pwm::collectives {

enum class StepKind : uint8_t { kSend, kRecv, kReduce, kCopy };

struct Step {
  StepKind kind;
  int peer = -1;              // group index (send/recv)
  void* dst = nullptr;        // recv target, reduce/copy output
  const void* a = nullptr;    // send source, reduce/copy input
  const void* b = nullptr;    // reduce second input
  size_t count = 0;           // elements (bytes = count * dtype size)
  uint32_t dep_begin = 0, dep_end = 0;  // range in Schedule::deps
};

// Reusable scratch memory, kept by a Communicator so that repeated collectives do not pay page
// faults for fresh temporaries. Not thread-safe (neither is a Communicator).
class ScratchPool {
 public:
  std::vector<std::byte> take(size_t bytes);
  void give(std::vector<std::byte>&& buf);

 private:
  std::vector<std::vector<std::byte>> free_;
};

class Schedule {
 public:
  using Id = uint32_t;

  Schedule(DataType dtype, ReduceOp op, std::shared_ptr<ScratchPool> pool);
  ~Schedule();
  Schedule(Schedule&&) = default;
  Schedule& operator=(Schedule&&) = default;

  // Each adder returns the new step's id; `deps` are ids of earlier steps (any number; kNone
  // entries are ignored so builders can pass "the last step that touched this region").
  static constexpr Id kNone = 0xffffffffu;
  using Deps = std::vector<Id>;
  Id send(int peer, const void* src, size_t count, const Deps& deps = {});
  Id recv(int peer, void* dst, size_t count, const Deps& deps = {});
  Id reduce(void* dst, const void* a, const void* b, size_t count, const Deps& deps = {});
  Id copy(void* dst, const void* src, size_t count, const Deps& deps = {});

  // Scratch owned by the schedule (returned to the pool when the schedule dies).
  void* scratch(size_t count);

  DataType dtype() const { return dtype_; }
  ReduceOp op() const { return op_; }
  size_t elem() const { return elem_; }
  const std::vector<Step>& steps() const { return steps_; }
  const std::vector<Id>& deps() const { return deps_; }

 private:
  Id add(Step s, const Deps& deps);

  DataType dtype_;
  ReduceOp op_;
  size_t elem_;
  std::vector<Step> steps_;
  std::vector<Id> deps_;
  std::shared_ptr<ScratchPool> pool_;
  std::vector<std::vector<std::byte>> scratch_;
};

// Balanced split of `count` elements into `parts` contiguous pieces: piece i is
// [offset(i), offset(i+1)).
inline size_t split_offset(size_t count, size_t parts, size_t i) {
  return (count / parts) * i + std::min(i, count % parts);
}

}  // namespace pwm::collectives
