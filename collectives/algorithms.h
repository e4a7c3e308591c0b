// Schedule builders, one per algorithm (internal header). Each appends to `s` the steps that
// group rank `r` of `n` performs. Buffers are the caller's; in-place when send == recv.
// `seg` is the pipelining segment in elements (ring and tree algorithms split each transfer
// into segments so that a segment is reduced or forwarded while the next one is in flight).
#pragma once

#include <cstddef>
#include <span>

#include "collectives/schedule.h"

namespace pwm::collectives::algo {

// Ring: reduce-scatter then all-gather, each n-1 steps; every chunk is reduced along the ring
// in one fixed order and then copied around, so all ranks end with the same bits.
// Window (total, offset): the count elements are elements [offset, offset + count) of a vector of
// `total` elements, cut into the chunks of that vector (clipped to the window, some empty), so
// each element is reduced in the order the whole vector's AllReduce reduces it. Without: the
// whole vector (total = count, offset = 0).
void allreduce_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg);
void allreduce_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg, size_t total,
                    size_t offset);
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

// AllToAll (alltoall.cc). Block i of send goes to rank i, block i of recv comes from rank i;
// in the v-forms blocks are packed in rank order, send_counts[i] / recv_counts[i] elements each
// (n entries; this rank's send_counts[r] == recv_counts[r]). In place (send == recv): the send
// blocks are first copied to scratch. Zero-element blocks are not sent.
// Pairwise exchange: step k (1 <= k < n) sends to r+k and receives from r-k once step k-1's
// send and receive are done; the own block's copy overlaps step 1.
void alltoallv_pairwise(Schedule& s, int r, int n, const void* send, std::span<const size_t> send_counts,
                        void* recv, std::span<const size_t> recv_counts);
// Linear: the pairwise messages, all posted at once (OpenMPI's basic linear).
void alltoallv_linear(Schedule& s, int r, int n, const void* send, std::span<const size_t> send_counts,
                      void* recv, std::span<const size_t> recv_counts);
// Bruck, equal counts: ceil(log2 n) steps; step k sends to r+2^k the blocks whose index,
// relative to r, has bit k set (p/2 of them, packed into one message).
void alltoall_bruck(Schedule& s, int r, int n, const void* send, void* recv, size_t count);

}  // namespace pwm::collectives::algo
