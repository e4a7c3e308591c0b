// What every fuzz target links, with libFuzzer or with replay_main.cc (fuzz.h).
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz.h"

[[noreturn]] void pwm_fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}
