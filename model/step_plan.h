// One training step as a plan: the units it runs, in order, and the gradient pieces they produce.
//
// A step is, per micro-batch m (0..M-1), the units
//   batch(m)  embed_fwd(m)  block_fwd(m, 0) .. block_fwd(m, L-1)  head(m)
//   block_bwd(m, L-1) .. block_bwd(m, 0)  embed_bwd(m)
// (head = head_forward then head_backward, which starts the backward), then a dp reduction of the
// gradient and one update. This file is the only place that order is written down:
//  - spmd_train and pathways_train's fused kernel execute it directly (train::accumulate_gradients);
//  - pathways_train's chained step traces it into one program and its opbyop step calls it unit
//    by unit (one kernel per unit kind, programs/trace.h, mpmd/trainer.cc);
//  - the MPMD pipeline partitions it by layer range (forward_units / backward_units of a stage).
// Since every executor runs the same units in the same order over the same model functions, the
// trainers' bitwise equality follows from construction, not from copies kept in step.
//
// Gradient pieces: the parts of the layout's one gradient buffer that a unit kind owns. Piece 0
// ("tied") is the embedding and the final norm (head(m) writes both, embed_bwd(m) adds the
// lookup's part of the embedding); piece 1 + l is layer l (block_bwd(m, l)). Pieces are whole
// tensors, so a per-tensor computation over pieces (norm, AdamW) is the same as over the buffer.
//
// Backward units (bucketing): the ranges of the buffer in the order the LAST micro-batch's
// backward finishes them (final_norm after head, layer l after block_bwd(l), embed after
// embed_bwd): what a bucketed dp AllReduce walks to overlap with the backward.
//
// Pure description: no allocation beyond the vectors, no model arithmetic; testable alone.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/grad_view.h"
#include "model/params.h"

namespace pwm::model {

enum class UnitKind { kBatch, kEmbedForward, kBlockForward, kHead, kBlockBackward, kEmbedBackward };
const char* unit_kind_name(UnitKind k);  // "batch", "embed_fwd", "block_fwd", "head", "block_bwd", "embed_bwd"

struct Unit {
  UnitKind kind;
  int64_t micro = 0;  // micro-batch index
  int layer = -1;     // block units only
  bool operator==(const Unit&) const = default;
};

class StepPlan {
 public:
  // The step of `layout`'s model over `microbatches` micro-batches.
  StepPlan(const ParamLayout& layout, int64_t microbatches);

  int layers() const { return layers_; }
  int64_t microbatches() const { return microbatches_; }

  // Micro-batch m's units: forward (batch, embed_fwd, block_fwd 0..L-1, head) and backward
  // (block_bwd L-1..0, embed_bwd). The whole step is forward(0), backward(0), forward(1), ...
  // For a pipeline stage holding layers [l0, l1): only the block units in that range, with the
  // batch and embedding units on the stage holding layer 0 (first) and the head on the stage
  // holding layer L-1 (last). Defaults: the whole model.
  std::vector<Unit> forward_units(int64_t m, int l0 = 0, int l1 = -1) const;
  std::vector<Unit> backward_units(int64_t m, int l0 = 0, int l1 = -1) const;
  std::vector<Unit> units() const;  // the whole step, in execution order

  // Gradient pieces (see above): count, the element ranges of each (in buffer order inside the
  // piece's own storage: "tied" stores embed then final_norm), its size and name.
  int num_pieces() const { return layers_ + 1; }
  static constexpr int kTiedPiece = 0;
  static int layer_piece(int layer) { return 1 + layer; }
  const std::vector<Range>& piece_ranges(int piece) const { return pieces_.at(static_cast<size_t>(piece)); }
  int64_t piece_size(int piece) const;
  std::string piece_name(int piece) const;  // "tied", "layer.3"
  // Which piece a backward unit accumulates into (-1 for units that write no gradient).
  int piece_of(const Unit& u) const;

  // The buffer's ranges in the order the last micro-batch's backward finishes them (final_norm,
  // layer L-1, ..., layer 0, embed), and the index of the range a backward unit finishes (-1 if
  // none): the caller's bucketed reduction is told "range i is final" after that unit.
  const std::vector<Range>& finish_order() const { return finish_; }
  int finishes(const Unit& u) const;

 private:
  int layers_;
  int64_t microbatches_;
  std::vector<std::vector<Range>> pieces_;
  std::vector<Range> finish_;
};

}  // namespace pwm::model
