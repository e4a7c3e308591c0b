// The fuzz targets' common contract (tests/fuzz/README.md).
//
// Each fuzz_<target>.cc defines libFuzzer's entry point, LLVMFuzzerTestOneInput, and a few valid
// inputs to start from (pwm_fuzz_seeds). The entry point returns 0 for every input the code
// under test accepts or rejects with pwm::Error; anything else (a crash, a sanitizer report, an
// other exception, a broken round trip) aborts. The same file links with libFuzzer in the fuzz
// build (-DPWM_FUZZ=ON, clang) and with replay_main.cc in every build, where it replays the seeds
// and the regressions/ inputs as a normal ctest case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// Named valid inputs of this target: the seed corpus.
std::vector<std::pair<std::string, std::string>> pwm_fuzz_seeds();

// Aborts with `what` on stderr: a finding (libFuzzer saves the input that led here).
[[noreturn]] void pwm_fuzz_fail(const std::string& what);
