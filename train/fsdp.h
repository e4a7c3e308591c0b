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
//  - layer l's weights all-gathered into the weight slot before block_fwd(l) and again before
//    block_bwd(l), and released after its forward (except the last layer, whose backward follows
//    at once) and after its backward (except layer 0 when another micro-batch follows, whose
//    forward starts with it);
//  - layer l's gradient computed into the zeroed gradient slot (the full layer), then
//    reduce-scattered over dp and added to the gradient shard; the gather of layer l-1 is started
//    beside that reduce-scatter, and both complete before block_bwd(l-1);
//  - the embedding / final norm gradients reduce-scattered once after the last micro-batch;
//  - with replicas, one AllReduce of the gradient shard over the replica group (the ranks holding
//    the same shard in the other replicas).
// One slot for weights and one for gradients, of the largest layer's size: the memory held is one
// gathered layer and one layer's gradient, whatever the depth, and no page is mapped, faulted in
// or zeroed by the kernel during a step. There is no prefetch of the next layer during a layer's
// compute: the collectives progress only inside their waits (collectives/communicator.h), so a
// prefetch could not hide a transfer, and it would hold a second layer (measured: the same
// tokens/s with two slots of each kind and prefetch; docs/spmd.md). The model's functions index a
// layer by its offset in the full buffer, so they get the slot's address minus that offset (as
// programs/step_kernels_units.cc does for its layer pieces). The embedding and final norm live in
// a reserved range laid out as the full buffer (common/lazy_array.h).
//
// Which ranks must call: every rank of the dp group (and of the replica group), every method
// that communicates, in the same order. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "common/lazy_array.h"
#include "train/data.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "train/config.h"
#include "train/step.h"
#include "model/transformer.h"

namespace pwm::train {

class Fsdp {
 public:
  // `dp`: the replica's dp group (size >= 2; group rank = dp index); `replicas`: the ranks with
  // the same dp and tp index in the other replicas (null or size 1 when there is one replica).
  // Both must outlive this object.
  Fsdp(const train::TrainConfig& cfg, const model::ParamLayout& layout, const model::StepPlan& plan,
       collectives::Communicator* dp, collectives::Communicator* replicas);
  ~Fsdp();

  int64_t shard_total() const { return shard_total_; }
  // The same count without a communicator: the floats of one dp rank's shard of `layout` over
  // D ranks (each piece's ceil(n / D)). For a runtime that sizes the shards before any
  // device exists (pathways_train's kernel signatures).
  static int64_t shard_total(const model::ParamLayout& layout, int D);

  // This rank's shard of a full (tp-layout) buffer. Local.
  void take_shard(const float* full, float* shard) const;
  // The full tp-layout buffer (layout.total() floats) from every dp rank's shard. Collective (dp).
  void gather_full(const float* shard, float* full);

  // The step's gradient, reduced over dp (and replicas) into `grads_shard`; returns this rank's
  // mean micro-batch loss, as train::accumulate_gradients (same units, same model functions).
  // `data_index` is the rank's index among all data-parallel ranks.
  double accumulate(const train::TextDataset& data, int64_t step, int data_index, const float* params_shard,
                    float* grads_shard, model::Workspace<float>& ws, int32_t* tokens, const train::StepHooks& hooks);
  // This rank's part of the squared global gradient norm (tp-replicated tensors on tp rank 0
  // only); summed over dp and tp it is the model's.
  double grad_sq_norm(const float* grads_shard) const;
  // AdamW over the shard (model::adamw_span per piece of tensor).
  void adamw(int64_t step, double lr, double clip, float* params, const float* grads, float* m, float* v) const;
  // As train::validation_loss_sum, the weights gathered layer by layer.
  double validation_loss_sum(const train::TextDataset& data, int data_index, const float* params_shard,
                             model::Workspace<float>& ws, int32_t* tokens, const model::TpReduce<float>& tp_reduce);

  // ---- As program nodes (pathways_train --granularity chained and opbyop): the runtime holds a
  // gathered piece and a layer's full gradient as arrays of its own, made and read by these calls
  // (each blocking, or returning the started collective). Piece i of the shard: 0 the embedding,
  // 1 + l layer l, L + 1 the final norm; chunk_sizes()[i] = s floats of it on each rank, gathered
  // D * s (the piece, then its zero padding).
  static std::vector<int64_t> chunk_sizes(const model::ParamLayout& layout, int D);
  // Layer l's weights gathered into `out` (D * s floats). Collective (dp).
  void gather_layer(int l, const float* params_shard, float* out);
  // The address the model indexes layer l by, for a gathered layer (or a full-layer gradient of
  // the same D * s floats): the array's start minus the layer's offset in the layout.
  const float* layer_base(int l, const float* gathered) const;
  float* layer_base(int l, float* gathered) const;
  // The embedding and final norm gathered into a buffer laid out as the full tp layout, held
  // (tied_params()) until release_tied_params(): as accumulate() holds them, for the whole step.
  // Collective (dp).
  void gather_tied_params(const float* params_shard);
  const float* tied_params() const;
  void release_tied_params();
  // Starts the reduce-scatter of layer l's full gradient (D * s floats, the padding zeroed) into
  // `chunk` (s floats); both stay the caller's until the returned work completes. Collective (dp).
  collectives::Work start_reduce_layer(int l, const float* grads, float* chunk);
  // The embedding's and the final norm's gradients (their layout sizes, summed over the
  // micro-batches) reduce-scattered into their chunks. Collective (dp).
  void reduce_tied_grads(const float* embed, const float* final_norm, float* embed_chunk, float* final_chunk);

  // Bytes of gathered weights, full-layer gradients and reduce-scatter scratch held at most at
  // once since construction (what the shards do not account for).
  int64_t peak_gathered_bytes() const { return peak_held_; }
  // Seconds spent waiting for gathers and reduce-scatters in the last accumulate() (or the last
  // blocking call of the program nodes' API).
  double comm_seconds() const { return comm_s_; }

 private:
  // The tied pieces' full gradient buffer zeroed (and counted as held); its data.
  float* begin_tied_grads();
  // Reduce-scatters the tied pieces' gradients into this rank's shard; releases the buffer.
  void finish_tied_grads(float* grads_shard);
  struct Piece {
    int64_t lo, hi;  // layout range
    int64_t s;       // shard elements (padded)
    int64_t off;     // offset of the shard in the shard buffers
    int64_t own_lo, own_hi;  // layout range this rank owns (clipped to [lo, hi))
  };
  const Piece& layer_piece(int l) const { return pieces_[static_cast<size_t>(1 + l)]; }
  // Layer l's slot of gathered weights / gradients (D * s floats), taken for l until put back.
  // Checks that the slot is free: in the plan's order a layer is released (its reduce-scatter
  // complete) before the next one takes the slot.
  float* take_slot(int l, bool grads);
  void put_slot(int l, bool grads);
  // The address the model indexes layer l by (the slot minus the layer's offset in the buffer).
  float* slot_base(int l, bool grads);
  void hold(int64_t bytes);
  void ensure_rs_tmp();  // rs_tmp_ made (and counted) on first use
  // Visits (tensor, layout begin, layout end, shard offset) for every owned piece of a tensor.
  void for_owned(const std::function<void(const model::ParamInfo&, int64_t, int64_t, int64_t)>& fn) const;
  void gather_tied(const float* params_shard);
  void release_tied();
  bool tied_held_ = false;  // gather_tied_params() until release_tied_params()
  double forward_loss(const float* params_shard, const int32_t* tokens, model::Workspace<float>& ws,
                      const model::TpReduce<float>& tp_reduce);
  // A timed wait (counted in comm_seconds()).
  void wait(collectives::Work& w);

  train::TrainConfig cfg_;
  const model::ParamLayout& layout_;
  const model::StepPlan& plan_;
  collectives::Communicator* dp_;
  collectives::Communicator* replicas_;
  int D_, r_, L_;
  std::vector<Piece> pieces_;  // embed, layers 0..L-1, final_norm
  int64_t shard_total_ = 0, max_layer_s_ = 0;
  LazyArray<float> tied_params_, tied_grads_;  // embedding and final norm
  // [grads]: the layer slots and the layer holding each (-1: free).
  std::vector<float> slot_[2];
  int slot_layer_[2] = {-1, -1};
  std::vector<float> rs_tmp_;  // one layer's reduce-scattered shard
  int64_t held_ = 0, peak_held_ = 0;
  double comm_s_ = 0;
};

}  // namespace pwm::train
