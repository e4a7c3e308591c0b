// Schedule builders, one per algorithm (internal header). Each appends to `s` the steps that
// group rank `r` of `n` performs. Buffers are the caller's; in-place when send == recv.
// `seg` is the pipelining segment in elements (ring and tree algorithms split each transfer
// into segments so that a segment is reduced or forwarded while the next one is in flight).
#pragma once

#include <cstddef>

#include "collectives/schedule.h"

namespace pwm::collectives::algo {

// Ring: reduce-scatter then all-gather, each n-1 steps; every chunk is reduced along the ring
// in one fixed order and then copied around, so all ranks end with the same bits.
void allreduce_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg);
// Recursive halving (reduce-scatter) then recursive doubling (all-gather), Rabenseifner's
// algorithm; non-power-of-two groups fold the first 2*(n - 2^k) ranks in pairs first.
void allreduce_halving_doubling(Schedule& s, int r, int n, const void* send, void* recv, size_t count);
// Recursive doubling on the whole vector: log2(n) exchanges; best for small messages.
void allreduce_recursive_doubling(Schedule& s, int r, int n, const void* send, void* recv, size_t count);

// Ring reduce-scatter: send holds n * count elements; recv gets block r (count elements).
void reduce_scatter_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg);
// Ring all-gather: send holds count elements; recv gets n * count, block i from rank i.
void allgather_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg);
// Binomial-tree broadcast of buf from group rank root, pipelined in segments.
void broadcast_binomial(Schedule& s, int r, int n, void* buf, size_t count, int root, size_t seg);
// Binomial-tree reduce to root; recv is used on root only.
void reduce_binomial(Schedule& s, int r, int n, const void* send, void* recv, size_t count, int root);
// Dissemination barrier: ceil(log2 n) rounds of empty messages.
void barrier_dissemination(Schedule& s, int r, int n);

}  // namespace pwm::collectives::algo
