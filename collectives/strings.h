// Variable-length byte strings over a Communicator (for reports: traces, straggler tables).
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace pwm::collectives {

// Every member passes its string and receives all of them, in group-rank order. Blocking;
// every member must call. Two collectives: an AllGather of the lengths, then of the padded bytes.
std::vector<std::string> allgather_strings(Communicator& comm, const std::string& mine);

}  // namespace pwm::collectives
