#include "dataflow/buffer.h"

#include <algorithm>
#include <iterator>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "common/check.h"
#include "common/env.h"
#include "common/memory.h"

namespace pwm::dataflow {

namespace {
std::atomic<int64_t> g_live{0}, g_live_bytes{0}, g_peak_bytes{0};

// Buffers of kPoolMinBytes or more come from segments the pool maps itself: a buffer is cut from
// the smallest free block that holds it (the rest stays free), and when it is freed it merges
// with its free neighbours. A new segment is kSegmentBytes, or for a buffer of more than half
// that, the buffer's size rounded up to 2 MiB (a 32 MiB segment per 19.7 MB activation left
// 13 MiB rests that smaller buffers then took: --fsdp's chained step held 247 MiB, not 200).
// Free blocks stay mapped for the next buffers of any size, as a device's caching allocator
// keeps device memory. Why keep them: a training step's outputs (the next step's parameters and
// optimizer state, 3 x 15.6 MB per device for the reference model) would otherwise come from
// fresh pages every step, and the kernel that writes them pays a page fault per 4 KiB (perf on
// a fused worker: ~6k faults, ~45% of all its faults, in AdamW's writes) where spmd_train
// updates in place. Why split and merge: a cache of whole buffers matched by size held more than
// was ever live at once, since a step's backward takes outputs of other sizes while its forward
// activations sit freed (compare.sh --moe's pw_static: 174 MiB of buffers, 150 live at most),
// and returning them to malloc fragmented its heap (docs/results/memory.md, 2026-12-07 19:35).
// The pool never unmaps by default. Smaller buffers are left to malloc, whose heap reuses them
// anyway. PWM_PW_BUFFER_CACHE_MB bounds the free bytes kept instead: a segment wholly free
// beyond it is unmapped; 0 takes every buffer from malloc, as AddressSanitizer's builds do (it
// then checks every buffer's bounds and lifetime). Free bytes are not counted in live_bytes(),
// which a memory cap limits.
constexpr size_t kPoolMinBytes = size_t{1} << 20;
constexpr size_t kSegmentBytes = size_t{32} << 20;
constexpr size_t kSegmentRound = size_t{2} << 20;
constexpr size_t kSplitMinBytes = size_t{64} << 10;  // a smaller rest stays with its buffer

class Pool {
 public:
  // A block of at least `alloc` bytes (a multiple of 64), 64-byte aligned.
  void* get(size_t alloc) {
    if (alloc < kPoolMinBytes || fixed_ == 0) return heap(alloc);
    std::lock_guard lock(mu_);
    const auto f = free_.lower_bound(alloc);
    char* at = f == free_.end() ? map_segment(alloc) : f->second;
    if (f != free_.end()) free_.erase(f);
    Block& b = blocks_.at(at);
    if (b.size - alloc >= kSplitMinBytes) {
      blocks_.emplace(at + alloc, Block{b.size - alloc, true, b.segment});
      free_.emplace(b.size - alloc, at + alloc);
      b.size = alloc;
    }
    b.free = false;
    free_bytes_ -= b.size;
    return at;
  }
  void put(void* p, size_t alloc) {
    if (alloc < kPoolMinBytes || fixed_ == 0) return std::free(p);
    std::lock_guard lock(mu_);
    auto it = blocks_.find(static_cast<char*>(p));
    PWM_CHECK(it != blocks_.end() && !it->second.free, "a buffer freed twice, or not the pool's");
    it->second.free = true;
    free_bytes_ += it->second.size;
    it = merge(it);
    const size_t seg = segments_.at(it->second.segment);
    if (fixed_ > 0 && it->first == it->second.segment && it->second.size == seg &&
        free_bytes_ > static_cast<size_t>(fixed_)) {
      unmap_pages(it->first, seg);
      free_bytes_ -= seg;
      mapped_bytes_ -= seg;
      segments_.erase(it->first);
      blocks_.erase(it);
      return;
    }
    free_.emplace(it->second.size, it->first);
  }
  size_t free_bytes() {
    std::lock_guard lock(mu_);
    return free_bytes_;
  }
  size_t mapped_bytes() {
    std::lock_guard lock(mu_);
    return mapped_bytes_;
  }

 private:
  struct Block {
    size_t size;
    bool free;
    char* segment;  // the start of its segment (blocks merge within one only)
  };
  using Blocks = std::map<char*, Block>;

  static void* heap(size_t alloc) {
    void* p = std::aligned_alloc(64, alloc);
    if (!p) throw std::bad_alloc();
    return p;
  }
  char* map_segment(size_t alloc) {
    const size_t rounded = (alloc + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
    const size_t seg = alloc > kSegmentBytes / 2 ? rounded : kSegmentBytes;
    char* at = static_cast<char*>(map_pages(seg));
    segments_.emplace(at, seg);
    blocks_.emplace(at, Block{seg, true, at});
    free_bytes_ += seg;
    mapped_bytes_ += seg;
    return at;
  }
  // Merges free block `it` with its free neighbours in the same segment; the merged block.
  Blocks::iterator merge(Blocks::iterator it) {
    if (const auto next = std::next(it); next != blocks_.end() && mergeable(it, next)) {
      unlist(next);
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin()) {
      if (const auto prev = std::prev(it); mergeable(prev, it)) {
        unlist(prev);
        prev->second.size += it->second.size;
        blocks_.erase(it);
        return prev;
      }
    }
    return it;
  }
  static bool mergeable(Blocks::iterator a, Blocks::iterator b) {
    return a->second.free && b->second.free && a->second.segment == b->second.segment;
  }
  void unlist(Blocks::iterator b) {  // out of the free list
    for (auto [i, end] = free_.equal_range(b->second.size); i != end; ++i)
      if (i->second == b->first) return void(free_.erase(i));
  }

  // The bound in bytes when PWM_PW_BUFFER_CACHE_MB is set, else negative (no bound).
#if defined(__SANITIZE_ADDRESS__)
  const double fixed_ = 0;
#else
  const double fixed_ = env_double("PWM_PW_BUFFER_CACHE_MB", -1.0) * (1 << 20);
#endif
  std::mutex mu_;
  Blocks blocks_;                         // every block of every segment, by address
  std::multimap<size_t, char*> free_;     // the free blocks, by size
  std::map<char*, size_t> segments_;      // start -> bytes
  size_t free_bytes_ = 0, mapped_bytes_ = 0;
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
int64_t Buffer::cached_bytes() { return static_cast<int64_t>(pool().free_bytes()); }
int64_t Buffer::mapped_bytes() { return static_cast<int64_t>(pool().mapped_bytes()); }

}  // namespace pwm::dataflow
