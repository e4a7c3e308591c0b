// Parameter layout and initialization: every parameter is a named view into ONE contiguous
// float buffer; gradients and the AdamW moments use the same layout in buffers of their own.
//
// Storage convention (docs/model.md): every matrix is stored row-major with C as its LAST
// dimension, and tensor parallelism always splits dim 0, so a tp shard is one contiguous block of
// rows of the full tensor (gather/scatter are memcpy's):
//   embed  [V, C]      replicated          x0 = embed[token];  logits = hf . embed^T
//   norm   [C]         replicated          per-block shared pre-norm scale
//   wk, wv [D, C]      replicated          k = h . wk^T (one shared K/V head)
//   wq     [H*D, C]    split dim 0 (heads) q = h . wq^T       rows h*D + d
//   w_gate [F, C]      split dim 0         gate = h . w_gate^T
//   w_up   [F, C]      split dim 0         up = h . w_up^T
//   wo     [H*D, C]    split dim 0 (heads) attn_out = a . wo  (stored [in, out])
//   w_down [F, C]      split dim 0         mlp_out = (silu(gate)*up) . w_down  (stored [in, out])
//   final_norm [C]     replicated
// Mixture-of-Experts layers (Config::moe_layer) have no w_gate/w_up/w_down; after wo they hold
//   router            [E, C]          replicated          logits = h . router^T (float32)
//   experts.w_gate_up [E, 2F, C]      split dim 0 over ep expert e: rows [gate (F) | up (F)]
//   experts.w_down    [E, F, C]       split dim 0 over ep expert e's down projection, [in, out]
// (an expert-parallel rank holds E/ep whole experts; MoE with tp > 1 is refused).
// Buffer order: embed, then for each layer l: norm, wk, wv, wq, w_gate, w_up, wo, w_down (MoE:
// norm, wk, wv, wq, wo, router, experts.w_gate_up, experts.w_down), then final_norm. Within a layer wk..w_up form one [2D + H*D/tp + 2F/tp, C] matrix ("w_in", one GEMM)
// and wo, w_down form one [H*D/tp + F/tp, C] matrix ("w_out", one GEMM). Ordering by layer lets a
// trainer form gradient buckets in reverse layer order (final_norm, layer L-1, ..., 0, embed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace pwm::model {

enum class ParamKind {
  kEmbed, kNorm, kWk, kWv, kWq, kWGate, kWUp, kWo, kWDown, kFinalNorm,
  kRouter, kExpertGateUp, kExpertDown  // Mixture-of-Experts layers
};

struct ParamInfo {
  std::string name;                  // "embed", "layers.3.wq", "final_norm"
  ParamKind kind;
  int layer;                         // -1 embed, 0..L-1 blocks, L final_norm
  std::vector<int64_t> full_shape;   // shape of the unsharded tensor
  std::vector<int64_t> shard_shape;  // shape held by this tp rank
  int split_dim;                     // -1 replicated, else 0 (rows split evenly over tp, or ep)
  bool expert = false;               // split over the expert-parallel ranks (not tp): experts.*
  int64_t offset;                    // element offset of the shard in the parameter buffer
  int64_t size;                      // elements in the shard
  int64_t full_offset;               // element offset of the shard inside the full tensor
  int64_t full_size;                 // elements in the full tensor
  bool weight_decay;                 // AdamW decay applies (matrices and embedding, not norms)
  bool replicated() const { return split_dim < 0; }
};

// Offsets of the fused per-layer matrices inside the buffer (elements), for tp rank's shard.
struct LayerOffsets {
  int64_t begin, end;  // all parameters of the layer: [begin, end)
  int64_t norm;        // [C]
  int64_t w_in;        // [R_in, C], R_in = 2D + Hs*D + 2Fs (rows: k, v, q, gate, up)
  int64_t w_out;       // [R_out, C], R_out = Hs*D + Fs (rows: wo, w_down)
  int64_t rows_in, rows_out;  // R_in, R_out of this layer (an MoE layer: 2D + Hs*D and Hs*D)
  bool moe = false;    // the MLP branch is Mixture-of-Experts (the three offsets below are set)
  int64_t router = -1;         // [E, C]
  int64_t expert_gate_up = -1; // [El, 2F, C]; the local experts' tensors are [expert_gate_up, end)
  int64_t expert_down = -1;    // [El, F, C]
};

class ParamLayout {
 public:
  // Throws pwm::Error if cfg is invalid or cannot be split over tp_size ranks (and its experts
  // over ep_size expert-parallel ranks, this one holding experts [ep_rank El, (ep_rank + 1) El)).
  ParamLayout(const Config& cfg, int tp_rank, int tp_size, int ep_rank = 0, int ep_size = 1);

  const Config& config() const { return cfg_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  int64_t local_heads() const { return cfg_.n_heads / tp_size_; }  // Hs
  int64_t local_ff() const { return cfg_.d_ff / tp_size_; }        // Fs
  int64_t w_in_rows() const;   // R_in of a dense layer = 2D + Hs*D + 2Fs (the largest)
  int64_t w_out_rows() const;  // R_out of a dense layer = Hs*D + Fs (the largest)
  int ep_rank() const { return ep_rank_; }
  int ep_size() const { return ep_size_; }
  int64_t local_experts() const { return cfg_.experts / ep_size_; }  // El
  int64_t first_expert() const { return ep_rank_ * local_experts(); }

  int64_t total() const { return total_; }  // elements in this rank's buffer
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& get(const std::string& name) const;  // throws if unknown
  const ParamInfo* find(const std::string& name) const;  // nullptr if unknown
  const LayerOffsets& layer(int l) const { return layers_.at(static_cast<size_t>(l)); }
  int64_t embed_offset() const { return 0; }
  int64_t final_norm_offset() const { return total_ - cfg_.d_model; }

 private:
  Config cfg_;
  int tp_rank_, tp_size_, ep_rank_, ep_size_;
  int64_t total_ = 0;
  std::vector<ParamInfo> params_;
  std::vector<LayerOffsets> layers_;
};

// Initialization as a pure function of (seed, name, full shape, element index in the full
// tensor): a counter-based RNG, so a tp shard is bitwise the slice of the full tensor and every
// dp/tp rank computes the same values without communication.
//   embed: N(0,1) / sqrt(C)  (tied with the output projection: logits start at unit scale)
//   matrices: N(0,1) / sqrt(fan_in), fan_in = C for wq/wk/wv/w_gate/w_up, H*D for wo, F for w_down
//   norm scales: 1
void init_params(const ParamLayout& layout, uint64_t seed, float* params /*[layout.total()]*/);
void init_params(const ParamLayout& layout, uint64_t seed, double* params);

// Counter-based standard normal for (seed, name, index): splitmix64 hashing + Box-Muller.
double init_normal(uint64_t seed, const std::string& name, int64_t index);

}  // namespace pwm::model
