// Monotonic clock helpers.
#pragma once

#include <cstdint>

namespace pwm {

// Microseconds / seconds on a monotonic clock with an arbitrary origin (steady_clock).
int64_t now_us();
double now_s();

}  // namespace pwm
