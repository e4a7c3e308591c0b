#include "pathways/object_store.h"

#include <algorithm>
#include <map>

namespace pwm::pathways {

void ObjectStore::put(uint64_t id, ObjectPtr obj, uint64_t owner) {
  entries_[id] = Entry{std::move(obj), owner};
}

ObjectPtr ObjectStore::find(uint64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.obj;
}

ObjectPtr ObjectStore::find(uint64_t id, uint64_t* owner) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  *owner = it->second.owner;
  return it->second.obj;
}

bool ObjectStore::erase(uint64_t id) { return entries_.erase(id) != 0; }

size_t ObjectStore::erase_owner(uint64_t owner) {
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.owner == owner) {
      it = entries_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

}  // namespace pwm::pathways
