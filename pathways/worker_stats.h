// What a worker holds (Client::stats(), the stats_reply message): for tests and the benchmark's
// leak check. Plain data, copied over the wire as is.
#pragma once

#include <cstdint>

namespace pwm::pathways {

struct WorkerStats {
  int32_t rank = 0;
  uint64_t objects = 0;   // object-store entries
  uint64_t buffers = 0;   // live buffers (store entries, run slots, transfers in flight)
  uint64_t bytes = 0;     // their bytes
  uint64_t programs = 0;  // cached lowered programs
  uint64_t runs = 0;      // runs in progress
  uint64_t kernels_run = 0;
  uint64_t waiting_runs = 0;  // runs held back because their buffers do not fit the memory cap
  uint64_t memory_cap = 0;    // bytes, 0 = none
  uint64_t peak_bytes = 0;    // the most bytes of live buffers seen at a run's admission
  uint64_t high_water_bytes = 0;  // the most bytes of live buffers ever, in this worker's process
  uint64_t peak_intermediate_bytes = 0;  // the most bytes of runs' intermediates alive at once here
  bool operator==(const WorkerStats&) const = default;
};

}  // namespace pwm::pathways
