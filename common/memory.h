// Resident memory of this process, for the trainers' metrics (issue 15: FSDP's saving is
// measured, not assumed). Linux only; both calls are cheap (one syscall / one small file read)
// and never throw: 0 means "not known".
#pragma once

#include <cstdint>

namespace pwm {

// High-water mark of the resident set since the process started (getrusage ru_maxrss), bytes.
int64_t peak_resident_bytes();
// Resident set now (/proc/self/statm), bytes.
int64_t current_resident_bytes();

}  // namespace pwm
