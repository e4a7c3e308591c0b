// Collectives simulated by their schedules: every rank's schedule is built by the collectives
// library's own builder (collectives/algorithms.h) and its sends, receives and reductions are
// played over the cluster's links.
//
// Message model: a send waits for its dependencies, then occupies its sender's port (the
// device's in-host port, or the host's NIC for a cross-host message) for overhead + bytes / bw
// and arrives `latency` later; a receive completes when it was posted and its message arrived
// (the k-th send from a to b matches b's k-th receive from a: the library's matching rule); a
// reduction costs bytes x gamma on its rank, a copy half that.
//
// Large buffers: the schedule is built for at most `max_elems` elements with the segment
// scaled by the same factor, and every message's bytes are multiplied back: the same steps and
// dependencies, without allocating terabytes for a projection.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/types.h"
#include "sim/sim.h"

namespace pwm::sim {

struct CollectiveResult {
  std::vector<double> done;  // per rank: its last step's end (us)
  double end = 0;            // the slowest rank
  size_t messages = 0;       // sends, all ranks
  collectives::Algorithm algorithm = collectives::Algorithm::kAuto;
};

// An AllReduce of `bytes` (float32) over `devices` (cluster device ids, group order), rank i
// entering at start[i] (empty: all at 0). kAuto picks what a Communicator picks
// (collectives::CostModel::from_env(), segment_bytes as CommunicatorOptions).
CollectiveResult simulate_allreduce(const Cluster& c, const Profile& p, const std::vector<int>& devices,
                                    size_t bytes, collectives::Algorithm a = collectives::Algorithm::kAuto,
                                    std::vector<double> start = {}, size_t segment_bytes = 256 << 10,
                                    size_t max_elems = 1 << 20);

// An AllToAll of `bytes_per_peer` (float32) to each of `devices`, played from the library's own
// schedules as simulate_allreduce does: pairwise on one link of latency L and bandwidth B takes
// (n-1)(L + m/B), Bruck ceil(log2 n) steps of ~n/2 blocks (with the packing copies at half the
// profile's reduction cost per byte), the cost model's alltoall_us over the cluster's links.
// kAuto picks what a Communicator picks (collectives::CostModel::from_env()); kMpi is modelled as
// pairwise; an AllReduce algorithm is refused (pwm::Error).
CollectiveResult simulate_alltoall(const Cluster& c, const Profile& p, const std::vector<int>& devices,
                                   size_t bytes_per_peer, collectives::Algorithm a = collectives::Algorithm::kAuto,
                                   std::vector<double> start = {}, size_t max_elems = 1 << 20);

// The algorithm a Communicator of `n` ranks picks for an AllReduce of `bytes` with kAuto.
collectives::Algorithm auto_algorithm(size_t bytes, int n, size_t segment_bytes = 256 << 10);

// A point-to-point message between two devices sent at `t`: its arrival time.
double message_arrival(const Cluster& c, int from, int to, double bytes, double t);

}  // namespace pwm::sim
