// Reading numeric settings from environment variables.
#pragma once

#include <cstdint>

namespace pwm {

// Environment helpers: the value of NAME parsed as a number, or `fallback` when unset.
// A set but unparsable value throws pwm::Error naming the variable.
double env_double(const char* name, double fallback);
int64_t env_int(const char* name, int64_t fallback);

}  // namespace pwm
