#include "common/lazy_array.h"

#include <sys/mman.h>
#include <unistd.h>

#include <utility>

#include "common/check.h"

namespace pwm {

LazyBytes::LazyBytes(size_t bytes) : bytes_(bytes) {
  if (bytes_ == 0) return;
  // MAP_NORESERVE: the reservation is address space; memory is committed page by page on write.
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  PWM_CHECK(p != MAP_FAILED, "cannot reserve {} bytes of address space", bytes_);
  data_ = p;
}

LazyBytes::~LazyBytes() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

LazyBytes::LazyBytes(LazyBytes&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

LazyBytes& LazyBytes::operator=(LazyBytes&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, bytes_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void LazyBytes::release(size_t begin, size_t end) {
  // Only whole pages inside the range: a page shared with a neighbouring range keeps its bytes.
  if (data_ == nullptr || begin >= end) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t a = (base + begin + page - 1) / page * page;
  const uintptr_t b = (base + end) / page * page;
  if (a < b) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

}  // namespace pwm
