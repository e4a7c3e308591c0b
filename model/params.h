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
// Buffer order: embed, then for each layer l: norm, wk, wv, wq, w_gate, w_up, wo, w_down, then
// final_norm. Within a layer wk..w_up form one [2D + H*D/tp + 2F/tp, C] matrix ("w_in", one GEMM)
// and wo, w_down form one [H*D/tp + F/tp, C] matrix ("w_out", one GEMM). Ordering by layer lets a
// trainer form gradient buckets in reverse layer order (final_norm, layer L-1, ..., 0, embed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace pwm::model {

enum class ParamKind { kEmbed, kNorm, kWk, kWv, kWq, kWGate, kWUp, kWo, kWDown, kFinalNorm };

struct ParamInfo {
  std::string name;                  // "embed", "layers.3.wq", "final_norm"
  ParamKind kind;
  int layer;                         // -1 embed, 0..L-1 blocks, L final_norm
  std::vector<int64_t> full_shape;   // shape of the unsharded tensor
  std::vector<int64_t> shard_shape;  // shape held by this tp rank
  int split_dim;                     // -1 replicated, else 0 (rows split evenly over tp)
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
};

class ParamLayout {
 public:
  // Throws pwm::Error if cfg is invalid or cannot be split over tp_size ranks.
  ParamLayout(const Config& cfg, int tp_rank, int tp_size);

  const Config& config() const { return cfg_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  int64_t local_heads() const { return cfg_.n_heads / tp_size_; }  // Hs
  int64_t local_ff() const { return cfg_.d_ff / tp_size_; }        // Fs
  int64_t w_in_rows() const;   // R_in = 2D + Hs*D + 2Fs
  int64_t w_out_rows() const;  // R_out = Hs*D + Fs

  int64_t total() const { return total_; }  // elements in this rank's buffer
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& get(const std::string& name) const;  // throws if unknown
  const ParamInfo* find(const std::string& name) const;  // nullptr if unknown
  const LayerOffsets& layer(int l) const { return layers_.at(static_cast<size_t>(l)); }
  int64_t embed_offset() const { return 0; }
  int64_t final_norm_offset() const { return total_ - cfg_.d_model; }

 private:
  Config cfg_;
  int tp_rank_, tp_size_;
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
