// The resource manager: devices, islands, virtual slices (docs/pathways.md).
//
// One device per worker rank (device d is world rank d + 1). Devices are grouped into islands:
// by default the workers of one host form an island; an explicit spec "KxM" (K islands of M
// devices, K*M = number of workers; "2x2") overrides it. A client asks for a virtual slice of n
// devices (optionally a mesh shape with n elements, optionally an island); the manager maps the
// virtual devices 1:1 onto n distinct non-drained devices of one island (a slice's collectives
// stay inside an island), choosing the least loaded ones, and gives the slice its own
// collectives context id. Draining a device moves every slice on it to another device of the
// same island; the slice's generation then changes, and programs lowered for the old
// generation are lowered again.
//
// Thread safety: all methods lock an internal mutex (clients allocate from their threads, the
// dispatcher reads mappings).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pwm::pathways {

struct DeviceInfo {
  int id = 0;
  int world_rank = 0;
  int island = 0;
  std::string host;
  bool drained = false;
  int load = 0;  // live slices mapped onto it
};

struct SliceInfo {
  int id = 0;
  int island = 0;
  std::vector<int> mesh;       // product = devices.size()
  std::vector<int> devices;    // device ids, virtual device i -> devices[i]
  std::vector<int> world_ranks() const;
  uint32_t context = 0;        // collectives context of the slice communicator
  uint64_t generation = 0;     // bumped when the mapping changes
};

struct SliceRemap {
  int slice = 0;
  int index = 0;  // virtual device whose physical device changed
  int from_device = 0, to_device = 0;
};

class ResourceManager {
 public:
  // `hosts[d]`: the host name of device d. `islands`: "" (by host) or "KxM".
  ResourceManager(std::vector<std::string> hosts, const std::string& islands);
  // "KxM" -> {K, M}, each a whole number >= 1 and nothing else; throws pwm::Error with one line.
  // (The trainer checks --islands with it at start-up, on every rank.)
  static std::pair<int, int> parse_islands(const std::string& islands);

  int num_devices() const;
  int num_islands() const;
  std::vector<DeviceInfo> devices() const;
  std::string describe() const;  // "2 islands: [0: devices 0,1 on host] ..."

  // Throws pwm::Error when the request cannot be met (more devices than exist or than any
  // island holds, a mesh whose product is not n, an unknown island).
  SliceInfo allocate(int n, std::vector<int> mesh = {}, int island = -1);
  void release(int slice_id);
  SliceInfo slice(int slice_id) const;  // throws for an unknown id
  bool has_slice(int slice_id) const;
  uint64_t generation(int slice_id) const;  // throws for an unknown id
  // A fresh context (and a new generation: its programs are lowered again) for a live slice
  // whose devices may have left collectives midway (runs cancelled after a loss: they are out
  // of step, and the messages left behind would match the old context's tags); the old context
  // is retired (below). Unknown ids are ignored (a released slice).
  void renew_context(int slice_id);

  // Retired context blocks. A block given up (drain, renew_context, an orphaned slice's
  // release) is handed out to no slice until it is reclaimed: messages of collectives abandoned
  // on it may still arrive. The dispatcher takes each retired block once (take_retired: its
  // first context and the devices of the slice that used it), has its live members drain it
  // (docs/pathways_liveness.md, "Reclaiming a context") and then calls reclaim(): the block
  // returns to the pool, barred for good for any slice with one of `excluded` (members that
  // were lost: their messages may still wait unmatched at the others; a receive names its
  // sender, so a group without them never matches one). take_retired() costs an atomic load
  // when nothing was retired (it is called on every dispatcher pass).
  struct RetiredBlock {
    uint32_t context = 0;      // the block's first context (kSliceContextStride of them)
    std::vector<int> devices;  // the devices of the slice that used it, when it was retired
  };
  std::vector<RetiredBlock> take_retired();
  void reclaim(uint32_t context, const std::vector<int>& excluded);
  // Blocks retired and not reclaimed yet (taken or not), for tests and error lines.
  size_t retired() const;

  // Marks the device drained and remaps every slice on it; returns what moved. Throws (and
  // changes nothing) when some slice has no spare device in its island, unless `keep_orphans`:
  // then only an idle device (no slice on it) is a spare, and a slice with none keeps the
  // drained device (to_device -1 in the result; orphaned() is true) while the others move. (A
  // busy device would hold two slices, say two replicas, and its loss would take both: the
  // client that keeps orphans goes on without the slice instead.)
  std::vector<SliceRemap> drain(int device, bool keep_orphans = false);
  // True when a device of the slice is drained: a drain found no spare for it (keep_orphans).
  bool orphaned(int slice_id) const;
  void undrain(int device);

 private:
  // A free block for a slice on `devices` (none of them barred from it); throws pwm::Error with
  // one line when there is none.
  uint32_t new_context(const std::vector<int>& devices);
  void retire(uint32_t context, const std::vector<int>& devices);
  int pick_spare(int island, const std::vector<int>& exclude, bool idle_only = false) const;

  mutable std::mutex mu_;
  std::vector<DeviceInfo> devs_;
  int n_islands_ = 0;
  std::map<int, SliceInfo> slices_;
  int next_slice_ = 1;
  uint32_t next_context_ = 0;
  std::map<uint32_t, int> contexts_in_use_;  // context -> its slice, or kRetiredContext
  // A context given up (drain, renew_context, an orphaned slice's release): handed out again
  // only once reclaim() says nothing of it can still arrive.
  static constexpr int kRetiredContext = -1;
  std::vector<RetiredBlock> retired_;         // not taken yet
  std::atomic<bool> has_retired_{false};      // retired_ is not empty (take_retired's fast path)
  std::map<uint32_t, std::vector<int>> barred_;  // block -> devices whose groups it may not serve
};

}  // namespace pwm::pathways
