#include "dataflow/buffer.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "common/check.h"
#include "common/env.h"

namespace pwm::dataflow {

namespace {
std::atomic<int64_t> g_live{0}, g_live_bytes{0}, g_peak_bytes{0};

// Freed buffers of kPoolMinBytes or more are kept for the next buffer of the same size, as a
// device allocator keeps device memory instead of returning it. Why: a training step's outputs
// (the next step's parameters and optimizer state, 3 x 15.6 MB per device for the reference
// model) would otherwise come from fresh pages every step, and the kernel that writes them pays
// a page fault per 4 KiB (perf on a fused worker: ~6k faults, ~45% of all its faults, in AdamW's
// writes) where spmd_train updates in place. Smaller buffers are left to malloc, whose heap
// reuses them anyway. The cache keeps at most the process's peak of live bytes plus 1 GiB: a step
// frees no more than was live at its peak, so in steady state every buffer of a step comes from
// the cache, at any batch size, and the 1 GiB leaves room for buffers of other sizes (other
// programs, older steps). (With a fixed 1 GiB, a chained step of 128 sequences per device, ~4 GB
// of buffers, took fresh pages for most of them every step: 1.6-1.8x slower steps and 1.6x the
// resident memory on this VM, whose page faults are expensive.) PWM_PW_BUFFER_CACHE_MB sets a
// fixed bound instead (0: no cache). The cache is not counted in live_bytes(), which a
// memory cap limits.
constexpr size_t kPoolMinBytes = size_t{1} << 20;
constexpr size_t kPoolHeadroomBytes = size_t{1} << 30;  // above the peak of live bytes

class Pool {
 public:
  void* get(size_t alloc) {
    if (alloc >= kPoolMinBytes) {
      std::lock_guard lock(mu_);
      if (auto it = free_.find(alloc); it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_ -= alloc;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, alloc);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void put(void* p, size_t alloc) {
    if (alloc >= kPoolMinBytes) {
      std::lock_guard lock(mu_);
      const size_t bound = fixed_ >= 0 ? static_cast<size_t>(fixed_)
                                       : static_cast<size_t>(g_peak_bytes.load()) + kPoolHeadroomBytes;
      if (cached_ + alloc <= bound) {
        free_.emplace(alloc, p);
        cached_ += alloc;
        return;
      }
    }
    std::free(p);
  }
  size_t cached() {
    std::lock_guard lock(mu_);
    return cached_;
  }

 private:
  // The bound in bytes when PWM_PW_BUFFER_CACHE_MB is set, else negative (the default bound).
  const double fixed_ = env_double("PWM_PW_BUFFER_CACHE_MB", -1.0) * (1 << 20);
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // by allocation size
  size_t cached_ = 0;
};
// Never destroyed: a Buffer may outlive every other static (the process returns the memory).
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}
size_t alloc_size(size_t bytes) { return (bytes + 63) / 64 * 64 + 64; }
}  // namespace

Buffer::Buffer(size_t bytes, bool lazy) : n_(bytes) {
  if (!lazy) allocate();
}

void* Buffer::allocate() {
  p_ = pool().get(alloc_size(n_));
  g_live++;
  const int64_t now = g_live_bytes += static_cast<int64_t>(n_);
  for (int64_t peak = g_peak_bytes.load(); now > peak && !g_peak_bytes.compare_exchange_weak(peak, now);) {
  }
  return p_;
}

void Buffer::take(Buffer& from) {
  PWM_CHECK(!p_ && from.p_ && from.n_ == n_, "buffer of {} bytes taking one of {}", n_, from.n_);
  p_ = from.p_;
  from.p_ = nullptr;
}

Buffer::~Buffer() {
  if (!p_) return;
  pool().put(p_, alloc_size(n_));
  g_live--;
  g_live_bytes -= static_cast<int64_t>(n_);
}

int64_t Buffer::live() { return g_live.load(); }
int64_t Buffer::live_bytes() { return g_live_bytes.load(); }
int64_t Buffer::peak_live_bytes() { return g_peak_bytes.load(); }
int64_t Buffer::cached_bytes() { return static_cast<int64_t>(pool().cached()); }

}  // namespace pwm::dataflow
