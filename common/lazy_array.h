// An array of n zero-initialised T in address space reserved with mmap (no memory committed):
// a page becomes resident when first written, and release() hands whole pages back (their
// contents read 0 again). For memory a run may never touch, or touch in parts: the model's own
// activations, which pathways_train's unit kernels replace by the object store's buffers
// (model::Activations); spmd_train --fsdp's embedding and final norm, laid out as the full
// parameter buffer and gathered piece by piece (train/fsdp.h).
//
// T must be trivially copyable (the pages are zero bytes). Movable, not copyable; not
// thread-safe. Throws pwm::Error when the address space cannot be reserved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace pwm {

// The untyped reservation under LazyArray.
class LazyBytes {
 public:
  LazyBytes() = default;
  explicit LazyBytes(size_t bytes);
  ~LazyBytes();
  LazyBytes(LazyBytes&& o) noexcept;
  LazyBytes& operator=(LazyBytes&& o) noexcept;
  LazyBytes(const LazyBytes&) = delete;
  LazyBytes& operator=(const LazyBytes&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Returns the pages lying wholly inside bytes [begin, end).
  void release(size_t begin, size_t end);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
class LazyArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  LazyArray() = default;
  explicit LazyArray(size_t n) : mem_(n * sizeof(T)), n_(n) {}
  LazyArray(LazyArray&& o) noexcept : mem_(std::move(o.mem_)), n_(std::exchange(o.n_, 0)) {}
  LazyArray& operator=(LazyArray&& o) noexcept {
    mem_ = std::move(o.mem_);
    n_ = std::exchange(o.n_, 0);
    return *this;
  }
  T* data() const { return static_cast<T*>(mem_.data()); }
  size_t size() const { return n_; }
  // Returns the pages lying wholly inside elements [begin, end).
  void release(int64_t begin, int64_t end) {
    mem_.release(static_cast<size_t>(begin) * sizeof(T), static_cast<size_t>(end) * sizeof(T));
  }

 private:
  LazyBytes mem_;
  size_t n_ = 0;
};

}  // namespace pwm
