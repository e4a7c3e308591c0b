// The object store of one worker: buffers keyed by object id, reference counted, owned by a
// client (docs/pathways.md, "Life of a buffer").
//
// An Object is one shard of a client-visible array (or an intermediate of a running program):
// a spec, a 64-byte aligned buffer, and a state (pending until every instruction writing it
// is done, then ready, or failed with an error). References are shared_ptrs: the store holds
// one per entry (dropped by a client's free, or by the end of its owner), a running program
// holds one per slot it uses; the buffer is freed when the last goes. A store is used by its
// worker's one thread only; the buffer cache is process-wide and locked (the in-process
// runtime runs several workers as threads). A freed Buffer of 1 MiB or more is kept (up to the
// process's peak of live bytes plus 1 GiB; PWM_PW_BUFFER_CACHE_MB sets a fixed bound) for the
// next Buffer of the same size, so a new
// Buffer's contents are undefined: its writers must write all of it. A lazy Buffer takes its
// memory at its first data() (a run's intermediates: when their first writer starts), so a
// program's buffers are not all allocated when its run arrives.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "pathways/dataflow.h"

namespace pwm::pathways {

class Buffer {
 public:
  explicit Buffer(size_t bytes, bool lazy = false);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return p_ ? p_ : allocate(); }
  bool allocated() const { return p_ != nullptr; }
  size_t size() const { return n_; }
  // Live (allocated) buffers and bytes in this process (in use; not the freed ones kept for
  // reuse), and the most bytes ever live at once (one worker per MPI process: that worker's).
  static int64_t live();
  static int64_t live_bytes();
  static int64_t peak_live_bytes();
  // Bytes of freed buffers kept for reuse (process-wide).
  static int64_t cached_bytes();

 private:
  void* allocate();
  void* p_ = nullptr;
  size_t n_;
};

struct Object {
  enum class State : uint8_t { kPending, kReady, kFailed };
  explicit Object(TensorSpec s, uint32_t writers = 0, bool lazy = false);
  TensorSpec spec;
  Buffer buf;
  State state;
  uint32_t pending_writes;
  std::string error;

  bool resolved() const { return state != State::kPending; }
  // One writer is done; the last makes the object ready (or leaves it failed).
  void write_done();
  void fail(const std::string& e);
};
using ObjectPtr = std::shared_ptr<Object>;

class ObjectStore {
 public:
  void put(uint64_t id, ObjectPtr obj, uint64_t owner);
  ObjectPtr find(uint64_t id) const;  // nullptr when absent
  ObjectPtr find(uint64_t id, uint64_t* owner) const;  // also its owner
  bool erase(uint64_t id);
  size_t erase_owner(uint64_t owner);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    ObjectPtr obj;
    uint64_t owner;
  };
  std::map<uint64_t, Entry> entries_;
};

}  // namespace pwm::pathways
