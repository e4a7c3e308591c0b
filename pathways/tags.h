// The runtime's share of the MPI tag space, next to the collectives' (docs/pathways.md).
//
// Collectives tag their messages `context (10 bits) << 20 | seq mod 2^16 << 4 | sub (4 bits)`,
// sub in {0, 1}. The runtime never builds a tag inside a context a Communicator may use:
//   context 0            the world communicator (tests, benchmarks around the runtime)
//   contexts 1..899      slice communicators (one per live physical slice, from the resource
//                        manager; the kernels' in-kernel collectives run on them)
//   contexts 900..999    free for code around the runtime (e.g. a benchmark's SPMD baseline)
//   contexts 1000..1015  worker-to-worker tensor transfers: run id mod 4096, transfer index
//   context  1016        object migrations (device drain): move id mod 2^20
//   context  1023        control messages, controller <-> worker (header and body tags)
#pragma once

#include <cstdint>

namespace pwm::pathways::tags {

constexpr uint32_t kFirstSliceContext = 1;
constexpr uint32_t kLastSliceContext = 899;
constexpr uint32_t kUserContextBase = 900;

constexpr int kDataTagBase = 1000 << 20;
constexpr uint32_t kMaxTransfersPerProgram = 4096;  // 12 bits of the data tag
constexpr int kMoveTagBase = 1016 << 20;
constexpr int kCtrlHeaderTag = (1023 << 20) | 1;
constexpr int kCtrlBodyTag = (1023 << 20) | 2;
constexpr int kMaxTagNeeded = (1 << 30) - 1;

// Transfers of one run are told apart by their index in the lowered program; runs by their id
// mod 4096. Two transfers between the same pair of workers can only share a tag if 4096 runs
// are in flight at once, and even then MPI's non-overtaking rule pairs them in run order.
inline int data_tag(uint64_t run_id, uint32_t xfer) {
  return kDataTagBase + static_cast<int>(((run_id & 0xfff) << 12) | (xfer & 0xfff));
}
inline int move_tag(uint64_t move_id) { return kMoveTagBase + static_cast<int>(move_id & 0xfffff); }

}  // namespace pwm::pathways::tags
