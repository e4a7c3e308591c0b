// Object ids: the names under which the controller and the workers know a buffer.
//
// Output k of run r is object (r << 16 | k), so that a kRun message need not carry its outputs'
// ids: the client, the dispatcher and the worker compute them. A client's put takes a run id of
// its own (output 0 of it). Run ids come from Controller::new_id() and stay below kMaxRunId.
// Pure functions: any thread, any rank.
#pragma once

#include <cstdint>

namespace pwm::pathways {

constexpr int kOutputIndexBits = 16;
constexpr uint64_t kMaxRunId = uint64_t{1} << 47;

inline uint64_t output_object_id(uint64_t run_id, uint32_t index) { return (run_id << kOutputIndexBits) | index; }
// The run whose output `object` is (for a put: the put's own id).
inline uint64_t run_of_object(uint64_t object) { return object >> kOutputIndexBits; }
// Which output of its run `object` is.
inline uint32_t output_index_of(uint64_t object) {
  return static_cast<uint32_t>(object & ((uint64_t{1} << kOutputIndexBits) - 1));
}

}  // namespace pwm::pathways
