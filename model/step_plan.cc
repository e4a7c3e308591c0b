#include "model/step_plan.h"

#include <fmt/format.h>

#include "common/check.h"

namespace pwm::model {

const char* unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::kBatch: return "batch";
    case UnitKind::kEmbedForward: return "embed_fwd";
    case UnitKind::kBlockForward: return "block_fwd";
    case UnitKind::kHead: return "head";
    case UnitKind::kBlockBackward: return "block_bwd";
    case UnitKind::kEmbedBackward: return "embed_bwd";
  }
  return "?";
}

StepPlan::StepPlan(const ParamLayout& layout, int64_t microbatches)
    : layers_(static_cast<int>(layout.config().n_layers)), microbatches_(microbatches) {
  PWM_CHECK(microbatches >= 1, "a step needs at least one micro-batch (got {})", microbatches);
  const ParamInfo& e = layout.get("embed");
  const Range embed{e.offset, e.offset + e.size};
  const Range final_norm{layout.final_norm_offset(), layout.total()};
  pieces_.push_back({embed, final_norm});
  for (int l = 0; l < layers_; ++l) pieces_.push_back({{layout.layer(l).begin, layout.layer(l).end}});
  finish_.push_back(final_norm);
  for (int l = layers_ - 1; l >= 0; --l) finish_.push_back(pieces_[static_cast<size_t>(layer_piece(l))][0]);
  finish_.push_back(embed);
}

std::vector<Unit> StepPlan::forward_units(int64_t m, int l0, int l1) const {
  if (l1 < 0) l1 = layers_;
  PWM_CHECK(0 <= l0 && l0 <= l1 && l1 <= layers_, "layer range [{}, {}) of {}", l0, l1, layers_);
  const bool first = l0 == 0, last = l1 == layers_;
  std::vector<Unit> u;
  if (first) {
    u.push_back({UnitKind::kBatch, m});
    u.push_back({UnitKind::kEmbedForward, m});
  }
  for (int l = l0; l < l1; ++l) u.push_back({UnitKind::kBlockForward, m, l});
  if (last) {
    if (!first) u.push_back({UnitKind::kBatch, m});  // the head's stage reads the targets too
    u.push_back({UnitKind::kHead, m});
  }
  return u;
}

std::vector<Unit> StepPlan::backward_units(int64_t m, int l0, int l1) const {
  if (l1 < 0) l1 = layers_;
  PWM_CHECK(0 <= l0 && l0 <= l1 && l1 <= layers_, "layer range [{}, {}) of {}", l0, l1, layers_);
  std::vector<Unit> u;
  for (int l = l1 - 1; l >= l0; --l) u.push_back({UnitKind::kBlockBackward, m, l});
  if (l0 == 0) u.push_back({UnitKind::kEmbedBackward, m});
  return u;
}

std::vector<Unit> StepPlan::units() const {
  std::vector<Unit> all;
  for (int64_t m = 0; m < microbatches_; ++m) {
    for (const Unit& u : forward_units(m)) all.push_back(u);
    for (const Unit& u : backward_units(m)) all.push_back(u);
  }
  return all;
}

int64_t StepPlan::piece_size(int piece) const {
  int64_t n = 0;
  for (const Range& r : piece_ranges(piece)) n += r.second - r.first;
  return n;
}

std::string StepPlan::piece_name(int piece) const {
  return piece == kTiedPiece ? std::string("tied") : fmt::format("layer.{}", piece - 1);
}

int StepPlan::piece_of(const Unit& u) const {
  switch (u.kind) {
    case UnitKind::kHead:
    case UnitKind::kEmbedBackward: return kTiedPiece;
    case UnitKind::kBlockBackward: return layer_piece(u.layer);
    default: return -1;
  }
}

int StepPlan::finishes(const Unit& u) const {
  switch (u.kind) {
    case UnitKind::kHead: return 0;
    case UnitKind::kBlockBackward: return layers_ - u.layer;
    case UnitKind::kEmbedBackward: return layers_ + 1;
    default: return -1;
  }
}

}  // namespace pwm::model
