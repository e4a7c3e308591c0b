#include "model/config.h"

#include <fmt/format.h>

#include <cmath>

#include "common/check.h"
#include "model/config_fields.h"

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
  validate_moe();
}

void Config::validate_moe() const {
  if (experts < 0) PWM_THROW("--experts must be >= 0 (0: a dense model; got {})", experts);
  if (experts > 4096) PWM_THROW("--experts must be at most 4096 (got {})", experts);
  if (experts == 0) return;
  if (top_k < 1 || top_k > experts)
    PWM_THROW("--top-k must be between 1 and --experts={} (got {})", experts, top_k);
  if (moe_every < 1) PWM_THROW("--moe-every must be >= 1 (1: every block is MoE; got {})", moe_every);
  if (moe_every > n_layers)
    PWM_THROW("--moe-every {} leaves no MoE layer in {} layers: choose at most {}", moe_every, n_layers, n_layers);
  if (!(capacity_factor >= 0.0) || !std::isfinite(capacity_factor))
    PWM_THROW("--capacity-factor must be >= 0 (0: dropless; got {})", capacity_factor);
  if (!(aux_loss >= 0.0) || !std::isfinite(aux_loss))
    PWM_THROW("--aux-loss must be >= 0 (got {})", aux_loss);
  if (!(router_z_loss >= 0.0) || !std::isfinite(router_z_loss))
    PWM_THROW("--router-z-loss must be >= 0 (got {})", router_z_loss);
  if (!std::isfinite(router_skew) || std::abs(router_skew) > 100)
    PWM_THROW("--router-skew must be within [-100, 100] (got {})", router_skew);
}

int64_t Config::expert_capacity(int64_t n) const {
  if (capacity_factor == 0.0) return -1;
  return static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(top_k * n) / static_cast<double>(experts)));
}

void Config::validate_tp(int64_t tp, int64_t ep) const {
  validate();
  if (tp <= 0) PWM_THROW("tensor parallelism: tp must be positive (got {})", tp);
  if (ep <= 0) PWM_THROW("expert parallelism: --expert-parallel must be positive (got {})", ep);
  if (ep > 1 && experts == 0)
    PWM_THROW("--expert-parallel {} needs a Mixture-of-Experts model: add --experts E (a multiple of {})", ep, ep);
  if (experts > 0 && experts % ep != 0)
    PWM_THROW("--experts {} is not divisible by --expert-parallel {}: choose a multiple of {}", experts, ep, ep);
  if (experts > 0 && tp > 1)
    PWM_THROW("--experts with --tp {}: experts are not split over tensor-parallel ranks; use --tp 1 and "
              "shard the experts with --expert-parallel",
              tp);
  if (n_heads % tp != 0)
    PWM_THROW("tensor parallelism: n_heads={} is not divisible by tp={}; choose tp dividing {}",
              n_heads, tp, n_heads);
  if (d_ff % tp != 0)
    PWM_THROW("tensor parallelism: d_ff={} is not divisible by tp={}; choose tp dividing {}", d_ff,
              tp, d_ff);
}

namespace {

// Parameters of the model when each MoE layer counts `experts_counted` experts.
int64_t params_with(const Config& c, int64_t experts_counted) {
  const int64_t C = c.d_model, H = c.n_heads, D = c.head_dim, F = c.d_ff;
  const int64_t attn = C            // norm scale
                       + C * H * D  // Wq
                       + 2 * C * D  // Wk, Wv (one shared head)
                       + H * D * C; // Wo
  const int64_t mlp = 3 * C * F;    // W_gate, W_up, W_down
  const int64_t moe_layers = c.moe_layers();
  const int64_t dense_layers = c.n_layers - moe_layers;
  const int64_t moe = c.experts * C + experts_counted * mlp;  // router, experts
  return c.vocab * C + dense_layers * (attn + mlp) + moe_layers * (attn + moe) + C;  // tied embedding, final norm
}

}  // namespace

int64_t Config::num_params() const { return params_with(*this, experts); }
int64_t Config::active_params() const { return params_with(*this, top_k); }

double Config::flops_per_token() const {
  return 6.0 * static_cast<double>(active_params()) +
         12.0 * static_cast<double>(n_layers * n_heads * head_dim * seq_len);
}

std::string Config::to_string() const {
  std::string s;  // every field, "key=value" (the MoE fields only for an MoE model)
  for (const ConfigField& f : config_fields())
    if (f.group == ConfigField::Group::kModel || experts != 0)
      s += fmt::format("{}{}={}", s.empty() ? "" : " ", f.key, field_text(*this, f));
  return s;
}

const char* norm_name(NormKind k) { return k == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"; }

NormKind parse_norm(const std::string& s) {
  if (s == "layernorm") return NormKind::kLayerNorm;
  if (s == "rmsnorm") return NormKind::kRmsNorm;
  PWM_THROW("unknown norm '{}': use layernorm or rmsnorm", s);
}

}  // namespace pwm::model
