// The runtime's share of the tag space, next to the collectives' (docs/pathways_wire.md).
//
// A logical tag is `channel << 15 | wire tag` (collectives/transport.h: MPI guarantees only
// 15-bit tags, so the channel is a separate MPI communicator). Channels [0, 16) belong to
// Communicator contexts (context c on channel c / 64); the runtime never builds a tag there:
//   contexts 0            the world communicator (tests, benchmarks around the runtime)
//   contexts 1..899       slice communicators (one per live physical slice, from the resource
//                         manager; the kernels' in-kernel collectives run on them), in blocks
//                         of dataflow::kSliceContextStride: the slice's, then its kernels'
//                         sub-groups'
//   contexts 900..999     free for code around the runtime (e.g. a benchmark's SPMD baseline)
// and uses the channels above them:
//   channels 16..47       worker-to-worker tensor transfers: 2^20 data tags, handed out in
//                         dispatch order (a range per run, one tag per transfer)
//   channel  48           object migrations (device drain): move id mod 2^15
//   channel  49           control messages, controller <-> worker (header and body tags)
//   channel  50           free for code around the runtime (e.g. a benchmark's result messages)
//   channels 51..63       free too (dispatch_bench times the static model's chain on 51 and 52)
#pragma once

#include <cstdint>

#include "collectives/transport.h"
#include "dataflow/lowering.h"

namespace pwm::pathways::tags {

constexpr uint32_t kFirstSliceContext = 1;
constexpr uint32_t kLastSliceContext = 899;
constexpr uint32_t kUserContextBase = 900;

constexpr int kDataChannel = collectives::kFirstFreeChannel;
constexpr int kDataChannels = 32;
constexpr int kMoveChannel = kDataChannel + kDataChannels;
constexpr int kCtrlChannel = kMoveChannel + 1;
constexpr int kUserChannel = kCtrlChannel + 1;
static_assert(kUserChannel < collectives::kChannels);

constexpr int kCtrlHeaderTag = collectives::logical_tag(kCtrlChannel, 1);
constexpr int kCtrlBodyTag = collectives::logical_tag(kCtrlChannel, 2);
constexpr int kMaxTagNeeded = collectives::logical_tag(kUserChannel, collectives::kWireTagLimit - 1);

// Data tags. The dispatcher gives each run a base (RunHeader::xfer_base) and advances it by the
// run's transfer count modulo kDataTags; transfer x of the run is tagged base + x. A tag is
// therefore reused only after 2^20 transfers have been dispatched, whatever the number of runs,
// clients or their ids (today's 4096-run window of the 30-bit layout is far exceeded).
constexpr uint32_t kDataTags = static_cast<uint32_t>(kDataChannels) << collectives::kWireTagBits;
static_assert(dataflow::kMaxTransfersPerProgram * 256 <= kDataTags);  // a run takes at most 1/256 of them
inline int data_tag(uint32_t xfer_base, uint32_t xfer) {
  const uint32_t t = (xfer_base + xfer) % kDataTags;
  return collectives::logical_tag(kDataChannel + static_cast<int>(t >> collectives::kWireTagBits),
                                  static_cast<int>(t % collectives::kWireTagLimit));
}
inline int move_tag(uint64_t move_id) {
  return collectives::logical_tag(kMoveChannel, static_cast<int>(move_id % collectives::kWireTagLimit));
}
// A tag for code around the runtime (benchmarks, tests): `index` < 2^15.
inline int user_tag(int index) { return collectives::logical_tag(kUserChannel, index); }

}  // namespace pwm::pathways::tags
