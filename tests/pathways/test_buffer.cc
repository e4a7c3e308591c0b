// The buffer pool (dataflow/buffer.h): reuse without new memory, blocks split and merged, kept
// at any size, and PWM_PW_BUFFER_CACHE_MB's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dataflow/buffer.h"

namespace pwm::dataflow {
namespace {

// The pool's contract (dataflow/buffer.h), where it is in use (not with PWM_PW_BUFFER_CACHE_MB,
// not under AddressSanitizer, where every buffer is malloc's).
bool pool_in_use() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#else
  return std::getenv("PWM_PW_BUFFER_CACHE_MB") == nullptr;
#endif
}

// A freed buffer of 1 MiB or more serves the next buffer: the pool maps nothing more (the
// training step's state then lands in memory already mapped); live counts only buffers in use.
TEST(Buffer, FreedBuffersServeTheNextWithoutNewMemory) {
  if (!pool_in_use()) GTEST_SKIP() << "the pool is not in use";
  const int64_t live0 = Buffer::live(), bytes0 = Buffer::live_bytes();
  const size_t n = (size_t{2} << 20) + 4;  // not a multiple of 64
  {
    Buffer a(n);
    std::memset(a.data(), 0x5a, n);
    EXPECT_EQ(Buffer::live(), live0 + 1);
    EXPECT_EQ(Buffer::live_bytes(), bytes0 + static_cast<int64_t>(n));
  }
  EXPECT_EQ(Buffer::live(), live0);
  EXPECT_EQ(Buffer::live_bytes(), bytes0);
  const int64_t mapped = Buffer::mapped_bytes();
  Buffer b(n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  Buffer c(n);  // two at once: different memory
  EXPECT_NE(c.data(), b.data());
  EXPECT_EQ(Buffer::mapped_bytes(), mapped);
}

// A block is split for smaller buffers and merged again when they are freed: two buffers of
// half the size fit where one 256 MiB buffer was, and a 256 MiB buffer fits there again after.
// (Never written: no memory is committed.)
TEST(Buffer, BlocksSplitForSmallerBuffersAndMergeWhenFreed) {
  if (!pool_in_use()) GTEST_SKIP() << "the pool is not in use";
  const size_t big = size_t{256} << 20, half = (size_t{128} << 20) - 256;
  char* first;
  {
    Buffer a(big);
    first = static_cast<char*>(a.data());
  }
  const int64_t mapped = Buffer::mapped_bytes();
  {
    Buffer b(half), c(half);
    for (Buffer* x : {&b, &c}) {
      const char* p = static_cast<char*>(x->data());
      EXPECT_TRUE(p >= first && p + half <= first + big) << "a half-size buffer outside the freed block";
    }
    EXPECT_NE(b.data(), c.data());
    EXPECT_EQ(Buffer::mapped_bytes(), mapped);
  }
  Buffer d(big);
  EXPECT_EQ(d.data(), first);
  EXPECT_EQ(Buffer::mapped_bytes(), mapped);
}

// With no bound the pool keeps every freed block, however large: three 400 MiB buffers live at
// once come back at the same addresses, with no new mapping.
TEST(Buffer, FreedBlocksAreKeptAtAnySize) {
  if (!pool_in_use()) GTEST_SKIP() << "the pool is not in use";
  const size_t n = size_t{400} << 20;
  std::vector<void*> first;
  int64_t cached1 = 0;
  {
    Buffer a(n), b(n), c(n);
    first = {a.data(), b.data(), c.data()};
    EXPECT_GE(Buffer::peak_live_bytes(), static_cast<int64_t>(3 * n));
    cached1 = Buffer::cached_bytes();
  }
  EXPECT_GE(Buffer::cached_bytes(), cached1 + static_cast<int64_t>(3 * n));
  const int64_t mapped = Buffer::mapped_bytes();
  Buffer a(n), b(n), c(n);
  std::vector<void*> again = {a.data(), b.data(), c.data()};
  std::sort(first.begin(), first.end());
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, first);
  EXPECT_EQ(Buffer::cached_bytes(), cached1);
  EXPECT_EQ(Buffer::mapped_bytes(), mapped);
}

// PWM_PW_BUFFER_CACHE_MB=32 (its own ctest case, tests/pathways/CMakeLists.txt): a segment wholly
// free is unmapped once the free bytes pass the bound, and kept up to it.
TEST(Buffer, ABoundUnmapsWhollyFreeSegments) {
  const char* bound = std::getenv("PWM_PW_BUFFER_CACHE_MB");
#if defined(__SANITIZE_ADDRESS__)
  bound = nullptr;  // (every buffer is malloc's)
#endif
  if (bound == nullptr || std::string(bound) != "32") GTEST_SKIP() << "runs with PWM_PW_BUFFER_CACHE_MB=32";
  const int64_t mapped0 = Buffer::mapped_bytes();
  {
    Buffer a(size_t{64} << 20);  // a segment of its own: 66 MiB
    EXPECT_EQ(Buffer::mapped_bytes(), mapped0 + (int64_t{66} << 20));
  }
  EXPECT_EQ(Buffer::mapped_bytes(), mapped0);  // 66 MiB free > 32: unmapped
  {
    Buffer b(size_t{2} << 20);  // from a 32 MiB segment
  }
  EXPECT_EQ(Buffer::mapped_bytes(), mapped0 + (int64_t{32} << 20));  // 32 MiB free: kept
}

}  // namespace
}  // namespace pwm::dataflow
