// The controller's object directory: where every live object's shards are (slice, spec, world
// rank per shard) and whose it is, the frees queued for each worker, and the migrations a drain
// starts (the workers' object stores hold the data: object_store.h).
//
// An object is entered when its run is accepted or its put is sent, leaves on the client's free
// (queued per worker and sent in one kFree per worker per dispatcher pass), on its client's
// disconnection (the workers drop theirs on kFreeOwner), and moves on a drain. Dispatcher thread
// only.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/resource_manager.h"
#include "pathways/wire.h"

namespace pwm::pathways {

struct ObjMeta {
  int slice = 0;
  dataflow::ArgSpec spec;
  std::vector<int> ranks;  // world rank of each shard
  uint64_t owner = 0;
};

class ObjectDirectory {
 public:
  void add(uint64_t id, ObjMeta m) { objects_[id] = std::move(m); }
  const ObjMeta* find(uint64_t id) const {
    auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : &it->second;
  }
  bool contains(uint64_t id) const { return objects_.count(id) != 0; }
  // Forgets `id`; free() also queues its free on the workers holding it.
  void forget(uint64_t id) { objects_.erase(id); }
  void free(uint64_t id);
  // Queues the free of `id` on world rank `rank` (an output of a run sent after its free).
  void queue_free(int rank, uint64_t id) { frees_[rank].push_back(id); }
  // Forgets every object of a client (the workers drop theirs on kFreeOwner).
  void forget_owner(uint64_t owner);
  // A drain remapped these virtual devices: every object on them moves from the old device to
  // the new one (kMoveOut and kMoveIn on a migration tag); the directory points at the new one.
  void migrate(const std::vector<SliceRemap>& plan, Channel& chan);
  // Sends the queued frees, one kFree per worker.
  void flush_frees(Channel& chan);

 private:
  std::map<uint64_t, ObjMeta> objects_;
  std::map<int, std::vector<uint64_t>> frees_;  // world rank -> objects to free there
  uint64_t next_move_ = 0;
};

}  // namespace pwm::pathways
