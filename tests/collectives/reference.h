// Inputs with exactly predictable collective results (nccl-tests' idea): rank r's element i is
// a small integer, so sums, maxima and minima are exact in every dtype and order.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/types.h"

namespace pwm::collectives::testing {

inline int64_t input_value(int rank, size_t i) { return (rank + 1) * static_cast<int64_t>(i % 13 + 1); }

inline int64_t expected_value(ReduceOp op, int n, size_t i) {
  const int64_t base = static_cast<int64_t>(i % 13 + 1);
  switch (op) {
    case ReduceOp::kSum: return base * n * (n + 1) / 2;
    case ReduceOp::kMax: return base * n;
    case ReduceOp::kMin: return base;
  }
  return 0;
}

// AllToAll: element i of the block rank `from` sends rank `to`; distinct for every (from, to)
// below 256 and exact in every dtype.
inline int64_t alltoall_value(int from, int to, size_t i) {
  return static_cast<int64_t>(from) * 4096 + static_cast<int64_t>(to) * 16 + static_cast<int64_t>(i % 13);
}

// A typed buffer of `count` elements, filled with fn(i).
template <typename F>
std::vector<std::byte> make_buffer(DataType t, size_t count, F fn) {
  std::vector<std::byte> b(count * dtype_size(t) + 1);  // +1: never a null data()
  for (size_t i = 0; i < count; ++i) {
    int64_t v = fn(i);
    switch (t) {
      case DataType::kFloat32: { float x = static_cast<float>(v); std::memcpy(&b[i * 4], &x, 4); break; }
      case DataType::kFloat64: { double x = static_cast<double>(v); std::memcpy(&b[i * 8], &x, 8); break; }
      case DataType::kInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(&b[i * 4], &x, 4); break; }
      case DataType::kInt64: std::memcpy(&b[i * 8], &v, 8); break;
    }
  }
  return b;
}

// Number of elements of `got` (count elements of type t) that differ from fn(i).
template <typename F>
size_t count_wrong(DataType t, const std::vector<std::byte>& got, size_t count, F fn) {
  auto want = make_buffer(t, count, fn);
  size_t wrong = 0;
  const size_t e = dtype_size(t);
  for (size_t i = 0; i < count; ++i) wrong += std::memcmp(&got[i * e], &want[i * e], e) != 0;
  return wrong;
}

}  // namespace pwm::collectives::testing
