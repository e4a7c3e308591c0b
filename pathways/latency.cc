// The one place the latency settings are read from the environment (latency.h).
#include "pathways/latency.h"

#include <utility>

#include "common/env.h"

namespace pwm::pathways {

LatencyPolicy LatencyPolicy::from_env() {
  LatencyPolicy p;
  const std::pair<const char*, double*> settings[] = {
      {"PWM_PW_BACKOFF_US", &p.busy_backoff_max_us},
      {"PWM_PW_BATCH_DIV", &p.batch_div},
      {"PWM_PW_WORKER_BACKOFF_US", &p.worker_backoff_max_us},
  };
  for (auto [name, value] : settings) *value = env_double(name, *value);
  return p;
}

}  // namespace pwm::pathways
