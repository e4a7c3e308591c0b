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

  // Throws pwm::Error with one line naming the bad field and how to fix it.
  void validate() const;
  // Additionally checks that the config can be sharded over `tp` ranks (heads and d_ff divisible).
  void validate_tp(int64_t tp) const;

  // Parameter count of the full (unsharded) model.
  int64_t num_params() const;
  // Training FLOPs per token as PaLM defines them for MFU (appendix B): 6 * N (N = all
  // parameters, the tied embedding counted once) plus the attention term 12 * L * H * D * T.
  // Reference config: 6 * 3,867,904 + 1,572,864 = 24,780,288.
  double flops_per_token() const;

  std::string to_string() const;  // one line, "d_model=256 n_layers=4 ..."
  bool operator==(const Config&) const = default;
};

const char* norm_name(NormKind k);
NormKind parse_norm(const std::string& s);  // "layernorm" | "rmsnorm"; throws otherwise

}  // namespace pwm::model
