// Sharded data parallelism (--fsdp: ZeRO-3, PaLM's sharded data parallelism) over the dp group
// of one replica.
//
// Sharding: the tp rank's parameter buffer (model/params.h) is cut into pieces - the embedding,
// each layer, the final norm - and every piece of n elements into dp slices of s = ceil(n / dp)
// (the last one zero-padded): dp rank r owns elements [r s, (r+1) s) of each piece. Parameters,
// gradients and both AdamW moments exist on a rank only as these shards (shard_total() floats
// each). AdamW and the squared norm are per element / per tensor, so they run on the shard's
// pieces of tensors with the arithmetic of the unsharded buffer (model/optim.h).
//
// One step (accumulate()): the plan's units (model/step_plan.h) in order, with
//  - the embedding and final norm gathered once for the step (used by the first and last units);
//  - layer l's weights all-gathered before block_fwd(l) and again before block_bwd(l), the
//    gather of the next layer in the order (l+1 forward, l-1 backward) started before layer l's
//    compute and waited for after it (prefetch); a layer is released after its forward (except
//    the last, whose backward follows at once) and after its backward (except layer 0 when another
//    micro-batch follows, whose forward starts with it);
//  - layer l's gradient computed into a zeroed full-layer buffer, then reduce-scattered over dp
//    (non-blocking: it runs during block_bwd(l-1)) and added to the gradient shard;
//  - the embedding / final norm gradients reduce-scattered once after the last micro-batch;
//  - with replicas, one AllReduce of the gradient shard over the replica group (the ranks holding
//    the same shard in the other replicas).
// Gathered weights and full-layer gradients live in address ranges laid out as the full buffer
// (so the model's functions index them unchanged), reserved once; a layer's part of its range is
// backed by one of two resident slots while the layer is in use (LazyBuffer::attach), so the
// memory held is two layers of weights and two of gradients, whatever the depth. Layers alternate
// between the two ranges (even, odd) so that the layer being prefetched never shares the slot of
// the one computing.
//
// Which ranks must call: every rank of the dp group (and of the replica group), every method
// that communicates, in the same order. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "model/data.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "model/train_config.h"
#include "model/train_step.h"
#include "model/transformer.h"

namespace pwm::spmd {

// An address range of `floats` floats reserved (mmap, no memory committed), laid out as the full
// parameter buffer so that the model's functions index a layer in it unchanged.
//  - Without a slot (slot_bytes 0): pages become resident when first written and release()
//    returns them (their contents become 0). Used for the embedding and final norm.
//  - With a slot: `slot_bytes` of memory that stay resident for the buffer's life (a memfd).
//    attach(begin, end) maps the slot over the pages holding elements [begin, end) (contents:
//    whatever the slot held last: the caller overwrites them); release() maps zero pages back
//    over them. One attachment at a time. A layer's pages are thus neither faulted in nor zeroed
//    by the kernel every time it is gathered (measured: that cost FSDP half its throughput).
class LazyBuffer {
 public:
  explicit LazyBuffer(size_t floats, size_t slot_bytes = 0);
  ~LazyBuffer();
  LazyBuffer(const LazyBuffer&) = delete;
  LazyBuffer& operator=(const LazyBuffer&) = delete;
  float* data() const { return data_; }
  // Bytes of slot needed to attach elements [begin, end) of a buffer (whole pages).
  static size_t span_bytes(int64_t begin, int64_t end);
  // Slot buffers only: makes elements [begin, end) addressable, backed by the slot.
  void attach(int64_t begin, int64_t end);
  // Without a slot: returns the pages lying wholly inside elements [begin, end). With a slot:
  // detaches the current attachment (begin, end are not needed).
  void release(int64_t begin, int64_t end);

 private:
  std::pair<uintptr_t, uintptr_t> outer_pages(int64_t begin, int64_t end) const;
  float* data_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  size_t slot_bytes_ = 0;
  uintptr_t att_begin_ = 0, att_end_ = 0;  // the attached address range, if any
};

class Fsdp {
 public:
  // `dp`: the replica's dp group (size >= 2; group rank = dp index); `replicas`: the ranks with
  // the same dp and tp index in the other replicas (null or size 1 when there is one replica).
  // Both must outlive this object.
  Fsdp(const model::TrainConfig& cfg, const model::ParamLayout& layout, const model::StepPlan& plan,
       collectives::Communicator* dp, collectives::Communicator* replicas);
  ~Fsdp();

  int64_t shard_total() const { return shard_total_; }

  // This rank's shard of a full (tp-layout) buffer. Local.
  void take_shard(const float* full, float* shard) const;
  // The full tp-layout buffer (layout.total() floats) from every dp rank's shard. Collective (dp).
  void gather_full(const float* shard, float* full);

  // The step's gradient, reduced over dp (and replicas) into `grads_shard`; returns this rank's
  // mean micro-batch loss, as model::accumulate_gradients (same units, same model functions).
  // `data_index` is the rank's index among all data-parallel ranks.
  double accumulate(const model::TextDataset& data, int64_t step, int data_index, const float* params_shard,
                    float* grads_shard, model::Workspace<float>& ws, int32_t* tokens, const model::StepHooks& hooks);
  // This rank's part of the squared global gradient norm (tp-replicated tensors on tp rank 0
  // only); summed over dp and tp it is the model's.
  double grad_sq_norm(const float* grads_shard) const;
  // AdamW over the shard (model::adamw_span per piece of tensor).
  void adamw(int64_t step, double lr, double clip, float* params, const float* grads, float* m, float* v) const;
  // As model::validation_loss_sum, the weights gathered layer by layer.
  double validation_loss_sum(const model::TextDataset& data, int data_index, const float* params_shard,
                             model::Workspace<float>& ws, int32_t* tokens, const model::TpReduce<float>& tp_reduce);

  // Bytes of gathered weights, full-layer gradients and reduce-scatter scratch held at most at
  // once since construction (what the shards do not account for).
  int64_t peak_gathered_bytes() const { return peak_held_; }
  // Seconds spent waiting for gathers and reduce-scatters in the last accumulate().
  double comm_seconds() const { return comm_s_; }

 private:
  struct Piece {
    int64_t lo, hi;  // layout range
    int64_t s;       // shard elements (padded)
    int64_t off;     // offset of the shard in the shard buffers
    int64_t own_lo, own_hi;  // layout range this rank owns (clipped to [lo, hi))
  };
  const Piece& layer_piece(int l) const { return pieces_[static_cast<size_t>(1 + l)]; }
  LazyBuffer& params_buf(int l) { return *pbuf_[static_cast<size_t>(1 + (l & 1))]; }
  LazyBuffer& grads_buf(int l) { return *gbuf_[static_cast<size_t>(1 + (l & 1))]; }
  void hold(int64_t bytes);
  // Visits (tensor, layout begin, layout end, shard offset) for every owned piece of a tensor.
  void for_owned(const std::function<void(const model::ParamInfo&, int64_t, int64_t, int64_t)>& fn) const;
  void gather_tied(const float* params_shard);
  void release_tied();
  double forward_loss(const float* params_shard, const int32_t* tokens, model::Workspace<float>& ws,
                      const model::TpReduce<float>& tp_reduce);
  // A timed wait (counted in comm_seconds()).
  void wait(collectives::Work& w);

  model::TrainConfig cfg_;
  const model::ParamLayout& layout_;
  const model::StepPlan& plan_;
  collectives::Communicator* dp_;
  collectives::Communicator* replicas_;
  int D_, r_, L_;
  std::vector<Piece> pieces_;  // embed, layers 0..L-1, final_norm
  int64_t shard_total_ = 0, max_layer_s_ = 0;
  // [0]: embedding and final norm; [1], [2]: even and odd layers.
  std::unique_ptr<LazyBuffer> pbuf_[3], gbuf_[3];
  std::vector<float> rs_tmp_;  // one layer's reduce-scattered shard
  int64_t held_ = 0, peak_held_ = 0;
  double comm_s_ = 0;
};

}  // namespace pwm::spmd
