// Variable-length strings over a Communicator (traces, error messages).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace pwm::collectives {

// Every member passes its string and receives all of them, in group-rank order. Blocking;
// every member must call. Two collectives: an AllGather of the lengths, then of the padded bytes.
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine);

// Every member's string, gathered only when they differ: compares a 64-bit hash of each (one
// AllGather of one int64) and returns {} when all are equal, else allgather_strings(). For
// checking that every rank parsed the same configuration. Blocking; every member must call.
std::vector<std::string> gather_if_different(Communicator& comm, const std::string& mine);

// Runs `fn` on every member and agrees on the outcome: if it threw on any member, the message of
// the lowest such member is printed once, by group rank 0, as "<program>: error: <message>", and
// every member returns false. For checking input before a job starts, so that a mistake gives one
// line and a non-zero exit everywhere instead of a hang or an MPI_Abort banner. Blocking; every
// member must call.
bool agree_on_errors(Communicator& comm, const std::string& program, const std::function<void()>& fn);


}  // namespace pwm::collectives
