// The alpha-beta-gamma cost model behind Algorithm::kAuto (docs/collectives.md).
//
// time(message of m bytes) = alpha + m * beta; reducing m bytes costs m * gamma. For an
// AllReduce of N bytes over p ranks (p2 = largest power of two <= p, extra fold-in/out
// exchanges of N bytes when p is not a power of two):
//   ring:               2(p-1) * alpha' + 2 (p-1)/p * N * beta + (p-1)/p * min(N, p seg) * gamma
//                       (alpha' = alpha per segment: the chunk goes in ceil(N/p / seg) messages;
//                       pipelining hides every segment's reduction but the first's)
//   halving-doubling:   2 log2(p2) * alpha + 2 (p2-1)/p2 * N * beta + (p2-1)/p2 * N * gamma
//   recursive doubling: log2(p2) * (alpha + N * beta + N * gamma)
// For an AllToAll of m bytes per peer (L = ceil(log2 p); b_k = the number of block indices in
// [0, p) with bit k set, p/2 on average; copies cost gamma/2 per byte, as in the simulator):
//   pairwise: (p-1) * (alpha + m * beta)       (the own block's copy overlaps the first exchange)
//   bruck:    sum_k (alpha + b_k * m * beta) + (sum_{k: b_k > 1} b_k + p) * m * gamma/2
//             = L (alpha + (p/2) m beta) + the packing and final rotation copies
//   linear:   modelled as pairwise (every message posted at once; auto never picks it: ties go
//             to pairwise, and the alpha-beta model cannot tell them apart)
// The defaults were measured on one 2-core machine with OpenMPI's shared-memory transport;
// PWM_COLL_ALPHA_US, PWM_COLL_BETA_NS_PER_B, PWM_COLL_GAMMA_NS_PER_B override them.
#pragma once

#include <cstddef>

#include "collectives/types.h"

namespace pwm::collectives {

struct CostModel {
  double alpha_us = 1.0;          // per message
  double beta_ns_per_byte = 0.5;  // ~2 GB/s point-to-point
  double gamma_ns_per_byte = 0.2; // ~5 GB/s reduction (memory bound)

  static CostModel from_env();  // defaults, overridden by the environment variables above

  // Predicted microseconds; `seg_bytes` is the ring's pipelining segment.
  double allreduce_us(Algorithm a, size_t bytes, int p, size_t seg_bytes) const;
  // The cheapest of ring, halving-doubling and recursive doubling (never kMpi).
  Algorithm pick_allreduce(size_t bytes, int p, size_t seg_bytes) const;
  // Predicted microseconds of an AllToAll of `bytes_per_peer` bytes to each of p ranks.
  double alltoall_us(Algorithm a, size_t bytes_per_peer, int p) const;
  // The cheaper of pairwise and Bruck (never kMpi or kLinear); `equal_counts` false (alltoallv):
  // pairwise, as Bruck needs equal counts.
  Algorithm pick_alltoall(size_t bytes_per_peer, int p, bool equal_counts = true) const;
};

}  // namespace pwm::collectives
