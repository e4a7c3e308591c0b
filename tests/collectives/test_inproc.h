// What the collectives' in-process tests (test_inproc*.cc: ranks as threads) share.
#pragma once

#include "collectives/communicator.h"

namespace pwm::collectives::testing {

inline CommOptions default_options() {
  CommOptions o;
  o.timeout_s = 60;
  return o;
}

}  // namespace pwm::collectives::testing
