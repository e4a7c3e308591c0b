// The expert-parallel group's AllToAll as the model calls it (model::ExpertComm, model/moe.h),
// over a Communicator: one maker for both trainers (spmd_train's Trainer, pathways_train's
// devices), so that their expert exchanges are the same calls and give the same bits.
//
// counts: one AllToAll of int64 (every member's rows per expert). rows: one AllToAll of equal
// counts when every block has the same size (a capacity: GShard's static shapes), the
// variable-count form otherwise (dropless). Each call's time is added to every counter in
// `seconds`; with an enabled trace, a rows call is an "expert alltoall" span on row 0.
//
// Ownership: `c`, the counters and `trace` must outlive the returned functions. Which ranks call:
// every member of `c`, the same calls in the same order. Not thread-safe.
#pragma once

#include <vector>

#include "collectives/communicator.h"
#include "common/trace.h"
#include "model/moe.h"

namespace pwm::train {

// c == nullptr (a group of one): size 1, no functions (the model calls none).
model::ExpertComm<float> expert_alltoall(collectives::Communicator* c, std::vector<double*> seconds, Trace* trace);

}  // namespace pwm::train
