#include "model/params.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "common/check.h"

namespace pwm::model {

ParamLayout::ParamLayout(const Config& cfg, int tp_rank, int tp_size, int ep_rank, int ep_size)
    : cfg_(cfg), tp_rank_(tp_rank), tp_size_(tp_size), ep_rank_(ep_rank), ep_size_(ep_size) {
  cfg.validate_tp(tp_size, ep_size);
  PWM_CHECK(tp_rank >= 0 && tp_rank < tp_size, "tp_rank {} of {}", tp_rank, tp_size);
  PWM_CHECK(ep_rank >= 0 && ep_rank < ep_size, "ep_rank {} of {}", ep_rank, ep_size);
  const int64_t C = cfg.d_model, H = cfg.n_heads, D = cfg.head_dim, F = cfg.d_ff, V = cfg.vocab;
  const int L = static_cast<int>(cfg.n_layers);

  // Adds one tensor of full shape `shape` (dim 0 split over tp when `split`, over ep when
  // `expert`).
  auto add = [&](std::string name, ParamKind kind, int layer, std::vector<int64_t> shape, bool split,
                 bool decay, bool expert = false) {
    ParamInfo p;
    p.name = std::move(name);
    p.kind = kind;
    p.layer = layer;
    const int parts = expert ? ep_size : split ? tp_size : 1;
    const int part = expert ? ep_rank : split ? tp_rank : 0;
    int64_t row_len = 1;
    for (size_t i = 1; i < shape.size(); ++i) row_len *= shape[i];
    const int64_t local_rows = shape[0] / parts;
    p.full_shape = shape;
    p.shard_shape = shape;
    p.shard_shape[0] = local_rows;
    p.split_dim = split || expert ? 0 : -1;
    p.expert = expert;
    p.offset = total_;
    p.size = local_rows * row_len;
    p.full_offset = part * local_rows * row_len;
    p.full_size = shape[0] * row_len;
    p.weight_decay = decay;
    total_ += p.size;
    params_.push_back(std::move(p));
    return params_.back().offset;
  };

  add("embed", ParamKind::kEmbed, -1, {V, C}, false, true);
  for (int l = 0; l < L; ++l) {
    const std::string pre = fmt::format("layers.{}.", l);
    LayerOffsets lo;
    lo.moe = cfg.moe_layer(l);
    lo.begin = total_;
    lo.norm = add(pre + "norm", ParamKind::kNorm, l, {C}, false, false);
    lo.w_in = add(pre + "wk", ParamKind::kWk, l, {D, C}, false, true);
    add(pre + "wv", ParamKind::kWv, l, {D, C}, false, true);
    add(pre + "wq", ParamKind::kWq, l, {H * D, C}, true, true);
    if (!lo.moe) {
      add(pre + "w_gate", ParamKind::kWGate, l, {F, C}, true, true);
      add(pre + "w_up", ParamKind::kWUp, l, {F, C}, true, true);
    }
    lo.w_out = add(pre + "wo", ParamKind::kWo, l, {H * D, C}, true, true);
    if (!lo.moe) {
      add(pre + "w_down", ParamKind::kWDown, l, {F, C}, true, true);
    } else {
      lo.router = add(pre + "router", ParamKind::kRouter, l, {cfg.experts, C}, false, true);
      lo.expert_gate_up = add(pre + "experts.w_gate_up", ParamKind::kExpertGateUp, l, {cfg.experts, 2 * F, C}, false,
                              true, true);
      lo.expert_down = add(pre + "experts.w_down", ParamKind::kExpertDown, l, {cfg.experts, F, C}, false, true, true);
    }
    lo.rows_in = 2 * D + local_heads() * D + (lo.moe ? 0 : 2 * local_ff());
    lo.rows_out = local_heads() * D + (lo.moe ? 0 : local_ff());
    lo.end = total_;
    layers_.push_back(lo);
  }
  add("final_norm", ParamKind::kFinalNorm, L, {C}, false, false);
}

int64_t ParamLayout::w_in_rows() const {
  return 2 * cfg_.head_dim + local_heads() * cfg_.head_dim + 2 * local_ff();
}
int64_t ParamLayout::w_out_rows() const { return local_heads() * cfg_.head_dim + local_ff(); }

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParamLayout::get(const std::string& name) const {
  const ParamInfo* p = find(name);
  if (!p) PWM_THROW("model parameters: no tensor named '{}'", name);
  return *p;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Uniform in (0, 1): 53 random bits, never 0 (safe for log).
double to_unit(uint64_t r) { return (static_cast<double>(r >> 11) + 0.5) * 0x1.0p-53; }

double normal_from_key(uint64_t key, int64_t index) {
  const uint64_t i = static_cast<uint64_t>(index);
  const double u1 = to_unit(splitmix64(key ^ splitmix64(2 * i)));
  const double u2 = to_unit(splitmix64(key ^ splitmix64(2 * i + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  return splitmix64(splitmix64(seed) ^ fnv1a(name));
}

template <typename S>
void init_impl(const ParamLayout& layout, uint64_t seed, S* params) {
  const Config& c = layout.config();
  for (const ParamInfo& p : layout.params()) {
    S* out = params + p.offset;
    double scale = 0.0;  // 0 means "constant 1" (norm scales)
    switch (p.kind) {
      case ParamKind::kNorm:
      case ParamKind::kFinalNorm: scale = 0.0; break;
      case ParamKind::kEmbed: scale = 1.0 / std::sqrt(static_cast<double>(c.d_model)); break;
      case ParamKind::kWo:
        scale = 1.0 / std::sqrt(static_cast<double>(c.n_heads * c.head_dim));
        break;
      case ParamKind::kWDown:
      case ParamKind::kExpertDown: scale = 1.0 / std::sqrt(static_cast<double>(c.d_ff)); break;
      default: scale = 1.0 / std::sqrt(static_cast<double>(c.d_model)); break;
    }
    if (scale == 0.0) {
      for (int64_t i = 0; i < p.size; ++i) out[i] = S(1);
      continue;
    }
    const uint64_t key = tensor_key(seed, p.name);
    for (int64_t i = 0; i < p.size; ++i)
      out[i] = static_cast<S>(static_cast<float>(scale * normal_from_key(key, p.full_offset + i)));
  }
}

}  // namespace

double init_normal(uint64_t seed, const std::string& name, int64_t index) {
  return normal_from_key(tensor_key(seed, name), index);
}

// Values are rounded to float first in both precisions, so the double model starts from exactly
// the float model's parameters.
void init_params(const ParamLayout& layout, uint64_t seed, float* params) {
  init_impl(layout, seed, params);
}
void init_params(const ParamLayout& layout, uint64_t seed, double* params) {
  init_impl(layout, seed, params);
}

}  // namespace pwm::model
