// Object: one value a run of an instruction list reads or writes on this process: a spec, a
// 64-byte aligned buffer (dataflow/buffer.h) and a state: pending until every instruction writing
// it is done, then ready, or failed with an error that what reads it inherits. Both MPMD
// runtimes' values are Objects: a run's slots (dataflow/interpreter.h), the Pathways worker's
// object store (pathways/object_store.h) and the static model's array shards. References are
// shared_ptrs; the buffer is freed when the last goes. One thread uses an Object at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataflow/buffer.h"
#include "dataflow/program.h"

namespace pwm::dataflow {

struct Object {
  enum class State : uint8_t { kPending, kReady, kFailed };
  // `writers`: instructions that will write it (0: ready now, its contents the caller's to fill).
  // `lazy`: the buffer takes its memory at first use (Buffer).
  explicit Object(TensorSpec s, uint32_t writers = 0, bool lazy = false);
  TensorSpec spec;
  Buffer buf;
  State state;
  uint32_t pending_writes;
  std::string error;
  // What its readers need of it, when its writer said (KernelContext::set_used): of each piece of
  // `piece_bytes` bytes, the first used[k]. A send of one whole piece then carries only that
  // prefix (a dropless block's rows, not its static size). Empty: every byte.
  uint64_t piece_bytes = 0;
  std::vector<uint64_t> used;

  bool resolved() const { return state != State::kPending; }
  // One writer is done; the last makes the object ready (or leaves it failed).
  void write_done();
  void fail(const std::string& e);
};
using ObjectPtr = std::shared_ptr<Object>;

}  // namespace pwm::dataflow
