// The controller's object directory (object_directory.h).
#include "pathways/object_directory.h"

#include "pathways/messages.h"
#include "pathways/tags.h"

namespace pwm::pathways {

void ObjectDirectory::free(uint64_t id) {
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  for (int r : it->second.ranks) frees_[r].push_back(id);
  objects_.erase(it);
}

void ObjectDirectory::forget_owner(uint64_t owner) {
  for (auto it = objects_.begin(); it != objects_.end();)
    it = it->second.owner == owner ? objects_.erase(it) : std::next(it);
}

// The new copy is pending on the new device until its bytes arrive, so runs already sent there
// simply wait for it; the old device sends once its copy is complete.
void ObjectDirectory::migrate(const std::vector<SliceRemap>& plan, Channel& chan) {
  for (auto& r : plan) {
    for (auto& [id, m] : objects_) {
      if (m.slice != r.slice || m.ranks.at(r.index) != r.from_device + 1) continue;
      const int from = r.from_device + 1, to = r.to_device + 1, tag = tags::move_tag(next_move_++);
      chan.send(from, MoveOut{id, to, tag});
      chan.send(to, MoveIn{id, m.owner, m.spec.shard, from, tag});
      m.ranks[r.index] = to;
    }
  }
}

void ObjectDirectory::flush_frees(Channel& chan) {
  Free msg;
  for (auto& [r, ids] : frees_) {
    if (ids.empty()) continue;
    msg.objects.swap(ids);  // (ids keeps its capacity: no allocation per pass)
    chan.send(r, msg);
    msg.objects.clear();
    ids.swap(msg.objects);
  }
}

}  // namespace pwm::pathways
