// The object store of one worker: buffers keyed by object id, reference counted, owned by a
// client (docs/pathways.md, "Life of a buffer").
//
// An Object (dataflow/object.h) is one shard of a client-visible array (or an intermediate of a
// running program). References are shared_ptrs: the store holds
// one per entry (dropped by a client's free, or by the end of its owner), a running program
// holds one per slot it uses; the buffer is freed when the last goes. A store is used by its
// worker's one thread only; the buffers come from dataflow/buffer.h's process-wide cache (the
// in-process runtime runs several workers as threads).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dataflow/buffer.h"
#include "dataflow/object.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"

namespace pwm::pathways {

using dataflow::Buffer;

using dataflow::Object;
using dataflow::ObjectPtr;

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
