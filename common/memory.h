// Resident memory of this process, for the trainers' metrics (issue 15: FSDP's saving is
// measured, not assumed). Linux only; both calls are cheap (one syscall / one small file read)
// and never throw: 0 means "not known". And anonymous pages mapped outside malloc's heap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pwm {

// High-water mark of the resident set since the process started (getrusage ru_maxrss), bytes.
int64_t peak_resident_bytes();
// Resident set now (/proc/self/statm), bytes.
int64_t current_resident_bytes();

// `bytes` of zeroed, page-aligned memory mapped for the caller alone (mmap), outside malloc's
// heap; throws std::bad_alloc when it cannot be mapped. Give it back with unmap_pages.
void* map_pages(size_t bytes);
void unmap_pages(void* p, size_t bytes);

}  // namespace pwm
