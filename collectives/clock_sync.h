// Aligning the ranks' clocks: each rank's now_us() minus world rank 0's, measured once at start-up
// (MpiTransport) so that traces merged from several hosts line up, as they must on a real cluster
// where monotonic clocks have unrelated origins.
//
// Cristian's method: rank 0 sends a ping at t0 (its clock), the peer answers with its clock tp,
// rank 0 receives at t1. If the two legs take equal time, the peer's clock read tp at rank 0's
// (t0 + t1) / 2, so offset = tp - (t0 + t1) / 2, with an error of at most (t1 - t0) / 2. Of
// several round trips the one with the smallest round-trip time is kept (least queueing).
#pragma once

#include <cstdint>
#include <span>

namespace pwm::collectives {

struct ClockSample {
  int64_t t0 = 0;    // rank 0's clock when it sent the ping
  int64_t peer = 0;  // the peer's clock when it answered
  int64_t t1 = 0;    // rank 0's clock when the answer arrived
};

struct ClockOffset {
  int64_t offset_us = 0;  // peer clock minus rank 0's clock
  int64_t error_us = 0;   // half the round trip of the sample used: the bound on the error
};

// The estimate from the sample of least round-trip time. `samples` must not be empty.
ClockOffset estimate_clock_offset(std::span<const ClockSample> samples);

}  // namespace pwm::collectives
