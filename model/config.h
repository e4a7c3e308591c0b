// The Transformer's shape: one definition shared by the model, checkpoints and both trainers.
#pragma once

#include <cstdint>
#include <string>

namespace pwm::model {

enum class NormKind { kLayerNorm, kRmsNorm };

// Glossary used across model/: B = batch (sequences), T = sequence length, C = d_model,
// H = query heads, D = head_dim, F = MLP hidden (SwiGLU), V = vocab, L = layers.
struct Config {
  int64_t d_model = 256;    // C
  int64_t n_layers = 4;     // L
  int64_t n_heads = 4;      // H query heads; one shared K/V head (multi-query attention)
  int64_t head_dim = 64;    // D
  int64_t d_ff = 1024;      // F
  int64_t vocab = 256;      // V (byte-level)
  int64_t seq_len = 128;    // T
  double z_loss = 1e-4;     // coefficient of log(Z)^2 added to the cross-entropy
  double rope_base = 10000.0;
  NormKind norm = NormKind::kLayerNorm;
  uint64_t seed = 1234;     // parameter initialization seed

  // Mixture of Experts (docs/model_moe.md "Mixture of Experts"). experts = 0: dense. Otherwise the
  // MLP branch of every moe_every-th block (layers l with (l + 1) % moe_every == 0) is E SwiGLU
  // experts of hidden size d_ff behind a float32 softmax router choosing top_k of them per token.
  int64_t experts = 0;           // E
  int64_t top_k = 1;             // K
  int64_t moe_every = 1;
  double capacity_factor = 1.25; // rows per expert = ceil(factor * K * N / E); 0 = dropless
  double aux_loss = 0.01;        // load-balancing loss weight alpha (Switch: alpha E sum_i f_i P_i)
  double router_z_loss = 1e-3;   // router z-loss weight (ST-MoE: mean_n logsumexp(logits_n)^2)
  double router_skew = 0;        // routing-skew knob: expert e's logit += skew * (E-1-e)/(E-1)

  bool moe() const { return experts > 0; }
  bool moe_layer(int64_t l) const { return experts > 0 && (l + 1) % moe_every == 0; }
  int64_t moe_layers() const { return experts > 0 ? n_layers / moe_every : 0; }
  // Rows an expert takes from one routing group of n tokens (-1: dropless, no limit).
  int64_t expert_capacity(int64_t n) const;

  // Throws pwm::Error with one line naming the bad field and how to fix it.
  void validate() const;
  void validate_moe() const;  // the MoE fields (part of validate)
  // Additionally checks that the config can be sharded over `tp` ranks (heads and d_ff divisible)
  // and its experts over `ep` expert-parallel ranks (E divisible; MoE with tp > 1 is refused).
  void validate_tp(int64_t tp, int64_t ep = 1) const;

  // Parameter count of the full (unsharded) model: every expert counted.
  int64_t num_params() const;
  // Parameters a token passes through: the router and top_k experts of each MoE layer (= num_params
  // for a dense model).
  int64_t active_params() const;
  // Training FLOPs per token as PaLM defines them for MFU (appendix B): 6 * N (N = the active
  // parameters, the tied embedding counted once) plus the attention term 12 * L * H * D * T.
  // Reference config: 6 * 3,867,904 + 1,572,864 = 24,780,288. Padding rows an MoE layer computes
  // under a capacity are not model FLOPs.
  double flops_per_token() const;

  std::string to_string() const;  // one line, "d_model=256 n_layers=4 ..."
  bool operator==(const Config&) const = default;
};

const char* norm_name(NormKind k);
NormKind parse_norm(const std::string& s);  // "layernorm" | "rmsnorm"; throws otherwise

}  // namespace pwm::model
