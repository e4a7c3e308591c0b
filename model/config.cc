#include "model/config.h"

#include <fmt/format.h>

#include "common/check.h"

namespace pwm::model {

void Config::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) PWM_THROW("model config: {} must be positive (got {})", name, v);
  };
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("head_dim", head_dim);
  positive("d_ff", d_ff);
  positive("vocab", vocab);
  positive("seq_len", seq_len);
  if (head_dim % 2 != 0)
    PWM_THROW("model config: head_dim must be even for rotary embeddings (got {})", head_dim);
  if (vocab > 65536) PWM_THROW("model config: vocab must be at most 65536 (got {})", vocab);
  if (!(z_loss >= 0.0)) PWM_THROW("model config: z_loss must be >= 0 (got {})", z_loss);
  if (!(rope_base > 1.0)) PWM_THROW("model config: rope_base must be > 1 (got {})", rope_base);
}

void Config::validate_tp(int64_t tp) const {
  validate();
  if (tp <= 0) PWM_THROW("tensor parallelism: tp must be positive (got {})", tp);
  if (n_heads % tp != 0)
    PWM_THROW("tensor parallelism: n_heads={} is not divisible by tp={}; choose tp dividing {}",
              n_heads, tp, n_heads);
  if (d_ff % tp != 0)
    PWM_THROW("tensor parallelism: d_ff={} is not divisible by tp={}; choose tp dividing {}", d_ff,
              tp, d_ff);
}

int64_t Config::num_params() const {
  const int64_t C = d_model, H = n_heads, D = head_dim, F = d_ff;
  const int64_t per_layer = C            // norm scale
                            + C * H * D  // Wq
                            + 2 * C * D  // Wk, Wv (one shared head)
                            + H * D * C  // Wo
                            + 3 * C * F; // W_gate, W_up, W_down
  return vocab * C + n_layers * per_layer + C;  // tied embedding, final norm
}

double Config::flops_per_token() const {
  return 6.0 * static_cast<double>(num_params()) +
         12.0 * static_cast<double>(n_layers * n_heads * head_dim * seq_len);
}

std::string Config::to_string() const {
  return fmt::format(
      "d_model={} n_layers={} n_heads={} head_dim={} d_ff={} vocab={} seq_len={} z_loss={} "
      "rope_base={} norm={} seed={}",
      d_model, n_layers, n_heads, head_dim, d_ff, vocab, seq_len, z_loss, rope_base,
      norm_name(norm), seed);
}

const char* norm_name(NormKind k) { return k == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"; }

NormKind parse_norm(const std::string& s) {
  if (s == "layernorm") return NormKind::kLayerNorm;
  if (s == "rmsnorm") return NormKind::kRmsNorm;
  PWM_THROW("unknown norm '{}': use layernorm or rmsnorm", s);
}

}  // namespace pwm::model
