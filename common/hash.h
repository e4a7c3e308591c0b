// FNV-1a 64: a fast, portable hash whose bits are the same on every rank and every machine (the
// ranks compare configurations and settings by it; the trainers print the weights' hash).
// Not for security. Chain calls through `h` to hash several pieces as one stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pwm {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

inline uint64_t fnv1a64(std::string_view s, uint64_t h = kFnv1aOffset) { return fnv1a64(s.data(), s.size(), h); }

}  // namespace pwm
