// Buffer: one device buffer of a program's slot or an object, 64-byte aligned, from a
// process-wide pool (both MPMD models allocate their slots here).
//
// A Buffer of 1 MiB or more is cut from memory the pool keeps mapped, freed Buffers' included
// (merged, for the next Buffers of any size; PWM_PW_BUFFER_CACHE_MB bounds what is kept free,
// 0: none), so a new Buffer's contents are undefined: its writers must write all of it. A lazy
// Buffer takes its memory at its first data() (a run's intermediates: when their first writer
// starts), so a program's buffers are not all allocated when its run arrives. Thread-safe (the
// pool is locked; one Buffer is used by one thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pwm::dataflow {

class Buffer {
 public:
  explicit Buffer(size_t bytes, bool lazy = false);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return p_ ? p_ : allocate(); }
  bool allocated() const { return p_ != nullptr; }
  // Takes `from`'s memory (same size; this one not allocated yet): `from` is left unallocated and
  // the process's live bytes do not change. A donated input's buffer becoming an output's.
  void take(Buffer& from);
  size_t size() const { return n_; }
  // Live (allocated) buffers and bytes in this process (in use; not the freed ones kept for
  // reuse), and the most bytes ever live at once (one worker per MPI process: that worker's).
  static int64_t live();
  static int64_t live_bytes();
  static int64_t peak_live_bytes();
  // Bytes the pool keeps mapped and free for the next buffers (process-wide), and all it has
  // mapped (free and live).
  static int64_t cached_bytes();
  static int64_t mapped_bytes();

 private:
  void* allocate();
  void* p_ = nullptr;
  size_t n_;
};

}  // namespace pwm::dataflow
