#include "train/full_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include <cstdio>

#include "common/check.h"
#include "common/hash.h"
#include "model/kernels.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

std::vector<TensorData> gather_full(const ParamLayout& layout, const float* buffer,
                                    const TpGather& gather, const TpGather& ep_gather) {
  std::vector<TensorData> out;
  out.reserve(layout.params().size());
  for (const ParamInfo& p : layout.params()) {
    TensorData t{p.name, p.full_shape, std::vector<float>(static_cast<size_t>(p.full_size))};
    if (p.expert && layout.ep_size() > 1) {
      PWM_CHECK(ep_gather != nullptr, "expert parallelism {} needs a gather function", layout.ep_size());
      ep_gather(buffer + p.offset, t.values.data(), static_cast<size_t>(p.size));
    } else if (p.replicated() || p.expert || layout.tp_size() == 1) {
      std::memcpy(t.values.data(), buffer + p.offset, sizeof(float) * p.size);
    } else {
      PWM_CHECK(gather != nullptr, "tp={} needs a gather function", layout.tp_size());
      gather(buffer + p.offset, t.values.data(), static_cast<size_t>(p.size));
    }
    out.push_back(std::move(t));
  }
  return out;
}

void scatter_full(const ParamLayout& layout, const std::vector<TensorData>& full, float* buffer) {
  for (const ParamInfo& p : layout.params()) {
    auto it = std::find_if(full.begin(), full.end(), [&](const TensorData& t) { return t.name == p.name; });
    if (it == full.end()) PWM_THROW("checkpoint has no tensor '{}'", p.name);
    if (it->shape != p.full_shape)
      PWM_THROW("checkpoint tensor '{}' has shape [{}] but the model needs [{}]", p.name,
                fmt::join(it->shape, ","), fmt::join(p.full_shape, ","));
    std::memcpy(buffer + p.offset, it->values.data() + p.full_offset, sizeof(float) * p.size);
  }
}

uint64_t weights_hash(const std::vector<TensorData>& full) {
  uint64_t h = kFnv1aOffset;
  auto mix = [&h](const void* p, size_t n) { h = fnv1a64(p, n, h); };
  for (const auto& t : full) {
    mix(t.name.data(), t.name.size());
    mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
    mix(t.values.data(), t.values.size() * sizeof(float));
  }
  return h;
}

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace pwm::train
