// A gradient held as pieces in separate buffers, read per tensor through one view.
//
// The layout-shaped gradient buffer (model/params.h) is one piece covering everything; a runtime
// whose gradient pieces are separate buffers (pathways_train's chained step: one object per
// layer, one for the embedding and final norm) adds each piece with the layout ranges it holds
// back to back. Per-tensor code (the squared norm, AdamW: model/optim.h) then reads the pieces in
// place instead of copying them into one buffer first, with the same bits: it visits the same
// tensors in the same order. Every tensor must lie within one range. Non-owning.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/params.h"

namespace pwm::model {

using Range = std::pair<int64_t, int64_t>;  // [begin, end) elements of the layout's buffer

class GradView {
 public:
  GradView() = default;
  GradView(const ParamLayout& layout, const float* contiguous);  // the whole buffer, one piece
  // `base` holds the elements of `ranges` back to back.
  void add(const std::vector<Range>& ranges, const float* base);
  // Elements [offset, offset + size) of the layout's buffer; throws if they are not inside one
  // range of one piece.
  const float* at(int64_t offset, int64_t size) const;

 private:
  struct Part {
    Range range;
    const float* data;
  };
  std::vector<Part> parts_;
};

}  // namespace pwm::model
