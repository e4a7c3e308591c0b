#include "common/env.h"

#include <cstdlib>

#include "common/check.h"

namespace pwm {

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end == v || *end != '\0') PWM_THROW("environment variable {}='{}' is not a number", name, v);
  return d;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long long d = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0') PWM_THROW("environment variable {}='{}' is not an integer", name, v);
  return d;
}

}  // namespace pwm
