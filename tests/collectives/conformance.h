// Conformance checks written once against the Communicator interface and run on every
// transport (in-process threads and real MPI ranks), as IFRT's conformance tests are.
// Every member of `comm` must call the same function; each returns the failures it saw on this
// rank (empty when all is well).
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace pwm::collectives::testing {

struct ConformanceOptions {
  std::vector<size_t> counts = {0, 1, 7, 131, 300007};  // 300007 floats > 1 MiB
  bool with_mpi = false;                                // also algorithm kMpi as a reference
  // AllToAll's elements per peer (x group size per buffer); the largest spans several segments.
  std::vector<size_t> alltoall_counts = {0, 1, 7, 131, 70001};
};

// AllReduce: every algorithm x op x dtype x count, in place and out of place, against the
// analytic result; random floats: identical bits on every rank and every run, and within
// float tolerance of the kMpi reference when with_mpi.
std::vector<std::string> check_allreduce(Communicator& comm, const ConformanceOptions& o);
// ReduceScatter, AllGather, Broadcast (every root), Reduce (every root), Barrier.
std::vector<std::string> check_other_collectives(Communicator& comm, const ConformanceOptions& o);
// Two non-blocking AllReduces in flight at once, progressed by test().
std::vector<std::string> check_nonblocking(Communicator& comm);
// AllToAll, every AllToAll algorithm and kAuto (and kMpi when with_mpi, compared bitwise with
// pairwise's output), element by element against a plain loop over what each rank must receive:
// equal counts (o.alltoall_counts, every dtype, in place and out of place); alltoallv with all
// counts zero, uneven counts with zeros, a rank that sends nothing and one that receives nothing,
// and large uneven counts, with the receive counts from alltoall_counts (checked too).
std::vector<std::string> check_alltoall(Communicator& comm, const ConformanceOptions& o);
// A non-blocking AllToAll and AllToAllv in flight with an AllReduce on the same communicator.
std::vector<std::string> check_alltoall_nonblocking(Communicator& comm);
// `calls` rounds of one small AllReduce on every communicator of `comms` (same group, distinct
// contexts), all started before any is waited for: more calls than the tag space's window of 256
// per communicator, contexts that share wire tags on other channels (c and c + 64) and
// neighbouring contexts, then completed newest first. Each result is checked exactly.
std::vector<std::string> check_many_in_flight(const std::vector<Communicator*>& comms, int calls);
// A collective left by the wait hook's Interrupted (a Pathways worker whose peer was lost) is
// abandoned: world ranks 0 and 1 of `world` (transport `t`; the others only take part in its
// barriers) each enter an AllReduce of the pair alone, rank 0 first, and leave it by the hook.
// Rank 1's messages then reach rank 0 after its receives were withdrawn: rank 0's buffer must
// keep the bytes it wrote after leaving (a receive still posted would overwrite them). Then an
// AllReduce of the pair on a fresh context must give the exact sum. Needs 2 ranks or more.
std::vector<std::string> check_interrupted_collective(std::shared_ptr<Transport> t, Communicator& world);

// MPI's rule for a send's buffer (Transport::abandon): rank 0 leaves a large ring AllReduce of
// the pair (its sends are rendezvous-sized, so MPI reads their buffer only once a receive takes
// them) inside a BufferOwnerScope and drops its own reference to the buffer. The transport must
// keep the buffer while the sends are posted. Rank 1 then takes those messages (the same
// AllReduce on the same context, left by the hook once they arrived): rank 1 must receive rank
// 0's values, and rank 0's buffer must be freed once MPI is done (nothing kept for ever). Under
// AddressSanitizer a buffer freed too early is a heap-use-after-free in MPI. Needs 2 ranks or more.
std::vector<std::string> check_abandoned_send_keeps_its_buffer(std::shared_ptr<Transport> t, Communicator& world);

// Reclaiming a context after a loss (ContextDrain): ranks 0 and 1 each enter an AllReduce of the
// pair on one context alone, one after the other, and leave it by the hook, so each leaves
// messages the other never took. They exchange their counts (Transport::traffic), drain what is
// left, and then a fresh Communicator on the same context must give the exact sum (a stale
// message would be matched by its first receive instead). Both an eager size and a rendezvous
// one (`count` floats). Needs 2 ranks or more.
std::vector<std::string> check_context_drain(std::shared_ptr<Transport> t, Communicator& world, uint32_t context,
                                             size_t count);

}  // namespace pwm::collectives::testing
