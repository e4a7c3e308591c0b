#include "pathways/resource_manager.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "common/check.h"
#include "common/parse.h"
#include "pathways/tags.h"

namespace pwm::pathways {

std::vector<int> SliceInfo::world_ranks() const {
  std::vector<int> r;
  for (int d : devices) r.push_back(d + 1);
  return r;
}

std::pair<int, int> ResourceManager::parse_islands(const std::string& islands) {
  const size_t x = islands.find('x');
  const std::string what = fmt::format("--islands {} (KxM: K islands of M devices, e.g. 2x2)", islands);
  if (x == std::string::npos) PWM_THROW("{}: no 'x' between K and M", what);
  const int k = static_cast<int>(parse_whole(what, islands.substr(0, x), 1, 1 << 20));
  const int m = static_cast<int>(parse_whole(what, islands.substr(x + 1), 1, 1 << 20));
  return {k, m};
}

ResourceManager::ResourceManager(std::vector<std::string> hosts, const std::string& islands) {
  const int n = static_cast<int>(hosts.size());
  if (n == 0) PWM_THROW("resource manager: no worker devices (run with at least 2 ranks: 1 controller + workers)");
  for (int d = 0; d < n; ++d) devs_.push_back({d, d + 1, 0, hosts[d], false, 0});
  if (islands.empty()) {
    std::map<std::string, int> by_host;  // island ids in order of first appearance
    for (auto& d : devs_) {
      auto it = by_host.find(d.host);
      if (it == by_host.end()) it = by_host.emplace(d.host, static_cast<int>(by_host.size())).first;
      d.island = it->second;
    }
    n_islands_ = static_cast<int>(by_host.size());
  } else {
    const auto [k, m] = parse_islands(islands);
    // In 64 bits: K and M are each up to 2^20, so K x M can pass 2^31.
    const int64_t devices = static_cast<int64_t>(k) * m;
    if (devices != n)
      PWM_THROW("--islands {}: {} x {} = {} devices but there are {} workers; run with {} ranks",
                islands, k, m, devices, n, devices + 1);
    for (auto& d : devs_) d.island = d.id / m;
    n_islands_ = k;
  }
}

int ResourceManager::num_devices() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<int>(devs_.size());
}

int ResourceManager::num_islands() const {
  std::lock_guard<std::mutex> g(mu_);
  return n_islands_;
}

std::vector<DeviceInfo> ResourceManager::devices() const {
  std::lock_guard<std::mutex> g(mu_);
  return devs_;
}

std::string ResourceManager::describe() const {
  std::lock_guard<std::mutex> g(mu_);
  std::string s = fmt::format("{} devices in {} island(s):", devs_.size(), n_islands_);
  for (int i = 0; i < n_islands_; ++i) {
    std::vector<int> ids;
    for (auto& d : devs_)
      if (d.island == i) ids.push_back(d.id);
    s += fmt::format(" [island {}: devices {}]", i, fmt::join(ids, ","));
  }
  return s;
}

uint32_t ResourceManager::new_context(const std::vector<int>& devices) {
  // Blocks of kSliceContextStride: the slice's context, then its kernels' sub-groups'.
  const uint32_t span = (tags::kLastSliceContext - tags::kFirstSliceContext + 1) / dataflow::kSliceContextStride;
  size_t barred = 0;
  for (uint32_t i = 0; i < span; ++i) {
    uint32_t c = tags::kFirstSliceContext + (next_context_++ % span) * dataflow::kSliceContextStride;
    if (contexts_in_use_.count(c)) continue;
    if (auto b = barred_.find(c); b != barred_.end()) {
      const bool bars = std::any_of(devices.begin(), devices.end(), [&](int d) {
        return std::find(b->second.begin(), b->second.end(), d) != b->second.end();
      });
      barred += bars;
      if (bars) continue;
    }
    return c;
  }
  size_t retired = 0;
  for (const auto& [c, s] : contexts_in_use_) retired += s == kRetiredContext;
  PWM_THROW("resource manager: no collectives context left for devices [{}]: {} live slices, {} contexts retired "
            "after losses and not yet reclaimed, {} barred for these devices (of {})",
            fmt::join(devices, ","), contexts_in_use_.size() - retired, retired, barred, span);
}

void ResourceManager::retire(uint32_t context, const std::vector<int>& devices) {
  contexts_in_use_[context] = kRetiredContext;
  retired_.push_back({context, devices});
  has_retired_.store(true, std::memory_order_release);
}

std::vector<ResourceManager::RetiredBlock> ResourceManager::take_retired() {
  if (!has_retired_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> g(mu_);
  has_retired_.store(false, std::memory_order_relaxed);
  return std::exchange(retired_, {});
}

void ResourceManager::reclaim(uint32_t context, const std::vector<int>& excluded) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = contexts_in_use_.find(context);
  PWM_CHECK(it != contexts_in_use_.end() && it->second == kRetiredContext,
            "resource manager: context {} reclaimed but not retired", context);
  contexts_in_use_.erase(it);
  if (excluded.empty()) return;
  auto& b = barred_[context];
  for (int d : excluded)
    if (std::find(b.begin(), b.end(), d) == b.end()) b.push_back(d);
}

size_t ResourceManager::retired() const {
  std::lock_guard<std::mutex> g(mu_);
  size_t n = 0;
  for (const auto& [c, s] : contexts_in_use_) n += s == kRetiredContext;
  return n;
}

SliceInfo ResourceManager::allocate(int n, std::vector<int> mesh, int island) {
  std::lock_guard<std::mutex> g(mu_);
  if (n <= 0) PWM_THROW("resource manager: a slice needs at least one device (asked for {})", n);
  if (mesh.empty()) mesh = {n};
  int64_t prod = 1;
  for (int m : mesh) prod *= m;
  if (prod != n) PWM_THROW("resource manager: mesh [{}] has {} devices, not {}", fmt::join(mesh, ","), prod, n);
  if (n > static_cast<int>(devs_.size()))
    PWM_THROW("resource manager: asked for {} devices but there are only {} (run with more ranks or ask for fewer)",
              n, devs_.size());
  if (island >= n_islands_) PWM_THROW("resource manager: island {} does not exist ({} islands)", island, n_islands_);
  // Candidate islands: the requested one, or every island; take the one whose n least loaded
  // available devices carry the least load (ties: lower island id).
  int best_island = -1;
  int64_t best_load = 0;
  std::vector<int> best;
  int largest = 0;
  for (int i = 0; i < n_islands_; ++i) {
    if (island >= 0 && i != island) continue;
    std::vector<const DeviceInfo*> avail;
    for (auto& d : devs_)
      if (d.island == i && !d.drained) avail.push_back(&d);
    largest = std::max(largest, static_cast<int>(avail.size()));
    if (static_cast<int>(avail.size()) < n) continue;
    std::stable_sort(avail.begin(), avail.end(), [](auto* a, auto* b) { return a->load < b->load; });
    int64_t load = 0;
    std::vector<int> pick;
    for (int k = 0; k < n; ++k) {
      load += avail[k]->load;
      pick.push_back(avail[k]->id);
    }
    if (best_island < 0 || load < best_load) {
      best_island = i;
      best_load = load;
      best = pick;
    }
  }
  if (best_island < 0) {
    if (island >= 0)
      PWM_THROW("resource manager: asked for {} devices on island {} but it has {} available (a slice cannot span "
                "islands; change --islands or the slice's --dp/--tp)",
                n, island, largest);
    PWM_THROW("resource manager: asked for {} devices but the largest island has {} available "
              "(a slice cannot span islands; ask for fewer or regroup with --islands)", n, largest);
  }
  std::sort(best.begin(), best.end());
  SliceInfo s;
  s.id = next_slice_++;
  s.island = best_island;
  s.mesh = mesh;
  s.devices = best;
  s.context = new_context(best);
  contexts_in_use_[s.context] = s.id;
  for (int d : best) devs_[d].load++;
  slices_[s.id] = s;
  return s;
}

void ResourceManager::release(int slice_id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = slices_.find(slice_id);
  if (it == slices_.end()) return;
  bool orphan = false;
  for (int d : it->second.devices) {
    devs_[d].load--;
    orphan = orphan || devs_[d].drained;
  }
  // (An orphaned slice's collectives were abandoned too: its context is retired, as in drain.)
  if (orphan)
    retire(it->second.context, it->second.devices);
  else
    contexts_in_use_.erase(it->second.context);
  slices_.erase(it);
}

SliceInfo ResourceManager::slice(int slice_id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = slices_.find(slice_id);
  if (it == slices_.end()) PWM_THROW("resource manager: unknown slice {}", slice_id);
  return it->second;
}

void ResourceManager::renew_context(int slice_id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = slices_.find(slice_id);
  if (it == slices_.end()) return;
  SliceInfo& s = it->second;
  const uint32_t fresh = new_context(s.devices);  // (first: when none is left, nothing changes)
  retire(s.context, s.devices);
  s.context = fresh;
  contexts_in_use_[s.context] = s.id;
  s.generation++;
}

uint64_t ResourceManager::generation(int slice_id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = slices_.find(slice_id);
  if (it == slices_.end()) PWM_THROW("resource manager: unknown slice {}", slice_id);
  return it->second.generation;
}

bool ResourceManager::has_slice(int slice_id) const {
  std::lock_guard<std::mutex> g(mu_);
  return slices_.count(slice_id) != 0;
}

int ResourceManager::pick_spare(int island, const std::vector<int>& exclude, bool idle_only) const {
  int best = -1;
  for (auto& d : devs_) {
    if (d.island != island || d.drained || (idle_only && d.load > 0)) continue;
    if (std::find(exclude.begin(), exclude.end(), d.id) != exclude.end()) continue;
    if (best < 0 || d.load < devs_[best].load) best = d.id;
  }
  return best;
}

bool ResourceManager::orphaned(int slice_id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = slices_.find(slice_id);
  PWM_CHECK(it != slices_.end(), "resource manager: unknown slice {}", slice_id);
  for (int d : it->second.devices)
    if (devs_[d].drained) return true;
  return false;
}

std::vector<SliceRemap> ResourceManager::drain(int device, bool keep_orphans) {
  std::lock_guard<std::mutex> g(mu_);
  if (device < 0 || device >= static_cast<int>(devs_.size()))
    PWM_THROW("resource manager: cannot drain device {}: devices are 0..{}", device, devs_.size() - 1);
  if (devs_[device].drained) return {};
  // Plan first, so that a failure changes nothing.
  std::vector<SliceRemap> plan;
  devs_[device].drained = true;
  for (auto& [id, s] : slices_) {
    for (int i = 0; i < static_cast<int>(s.devices.size()); ++i) {
      if (s.devices[i] != device) continue;
      int to = pick_spare(s.island, s.devices, keep_orphans);
      if (to < 0 && keep_orphans) {
        plan.push_back({id, i, device, -1});
        continue;
      }
      if (to < 0) {
        devs_[device].drained = false;
        for (auto& p : plan) devs_[p.to_device].load--;
        PWM_THROW("resource manager: cannot drain device {}: slice {} (island {}, devices [{}]) has no spare device",
                  device, id, s.island, fmt::join(s.devices, ","));
      }
      plan.push_back({id, i, device, to});
      devs_[to].load++;  // so that the next slice spreads elsewhere
    }
  }
  for (auto& r : plan) {
    if (r.to_device < 0) continue;  // (kept: the slice is orphaned)
    SliceInfo& s = slices_[r.slice];
    const std::vector<int> before = s.devices;
    s.devices[r.index] = r.to_device;
    devs_[device].load--;
    // A new group needs a fresh tag space, and the old one is retired until reclaimed: the
    // collectives abandoned on it when the device was lost left messages that a receive with
    // their tags would still match (docs/collectives.md, "Leaving a collective").
    const uint32_t fresh = new_context(s.devices);
    retire(s.context, before);
    s.context = fresh;
    contexts_in_use_[s.context] = s.id;
    s.generation++;
  }
  return plan;
}

void ResourceManager::undrain(int device) {
  std::lock_guard<std::mutex> g(mu_);
  PWM_CHECK(device >= 0 && device < static_cast<int>(devs_.size()));
  devs_[device].drained = false;
}

}  // namespace pwm::pathways
