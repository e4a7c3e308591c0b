#include "model/grad_view.h"

#include "common/check.h"

namespace pwm::model {

GradView::GradView(const ParamLayout& layout, const float* contiguous) {
  parts_.push_back({{0, layout.total()}, contiguous});
}

void GradView::add(const std::vector<Range>& ranges, const float* base) {
  for (const Range& r : ranges) {
    parts_.push_back({r, base});
    base += r.second - r.first;
  }
}

const float* GradView::at(int64_t offset, int64_t size) const {
  for (const Part& p : parts_)
    if (p.range.first <= offset && offset + size <= p.range.second) return p.data + (offset - p.range.first);
  PWM_THROW("gradient elements [{}, {}) are not inside one piece", offset, offset + size);
}

}  // namespace pwm::model
