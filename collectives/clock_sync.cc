#include "collectives/clock_sync.h"

#include "common/check.h"

namespace pwm::collectives {

ClockOffset estimate_clock_offset(std::span<const ClockSample> samples) {
  PWM_CHECK(!samples.empty(), "no clock samples");
  const ClockSample* best = &samples[0];
  for (const ClockSample& s : samples)
    if (s.t1 - s.t0 < best->t1 - best->t0) best = &s;
  // (t0 + t1) / 2 without overflow on large clock values.
  const int64_t mid = best->t0 + (best->t1 - best->t0) / 2;
  return {best->peer - mid, (best->t1 - best->t0 + 1) / 2};
}

}  // namespace pwm::collectives
