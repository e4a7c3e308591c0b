#include "model/config_fields.h"

#include <fmt/format.h>

namespace pwm::model {

const std::vector<ConfigField>& config_fields() {
  using G = ConfigField::Group;
  constexpr double inf = std::numeric_limits<double>::infinity();
  static const std::vector<ConfigField> fields = {
      {"d_model", "--d-model", "model width C", G::kModel, &Config::d_model, true, 1},
      {"n_layers", "--layers", "Transformer blocks L", G::kModel, &Config::n_layers, true, 1},
      {"n_heads", "--heads", "query heads H (one shared K/V head)", G::kModel, &Config::n_heads, true, 1},
      {"head_dim", "--head-dim", "head dimension D", G::kModel, &Config::head_dim, true, 1},
      {"d_ff", "--d-ff", "SwiGLU hidden width F", G::kModel, &Config::d_ff, true, 1},
      {"vocab", "--vocab", "vocabulary (256 = bytes)", G::kModel, &Config::vocab, true, 1},
      {"seq_len", "--seq-len", "sequence length T", G::kModel, &Config::seq_len, true, 1},
      {"z_loss", "--z-loss", "z-loss coefficient", G::kModel, &Config::z_loss, true, 0, inf},
      {"rope_base", "--rope-base", "rotary embedding base", G::kModel, &Config::rope_base, true, 1, inf, true},
      {"norm", "--norm", "layernorm | rmsnorm (default layernorm)", G::kModel, &Config::norm},
      {"seed", "--seed", "parameter initialization seed", G::kModel, &Config::seed},
      {"experts", "--experts", "experts E in each MoE layer's MLP branch (0: a dense model)", G::kMoe, &Config::experts},
      {"top_k", "--top-k", "experts per token K", G::kMoe, &Config::top_k},
      {"moe_every", "--moe-every", "every N-th block is MoE (layers l with (l+1) % N == 0)", G::kMoe, &Config::moe_every},
      {"capacity_factor", "--capacity-factor",
       "rows per expert = ceil(factor * K * tokens / E), over-capacity choices dropped (0: dropless)", G::kMoe,
       &Config::capacity_factor, true, 0, 1e6},
      {"aux_loss", "--aux-loss", "load-balancing loss weight (alpha E sum f_i P_i)", G::kMoe, &Config::aux_loss, true, 0,
       inf},
      {"router_z_loss", "--router-z-loss", "router z-loss weight (mean logsumexp^2)", G::kMoe, &Config::router_z_loss,
       true, 0, inf},
      {"router_skew", "--router-skew",
       "routing-skew knob: expert e's logit += skew * (E-1-e)/(E-1) (imbalance experiments)", G::kMoe,
       &Config::router_skew, true, -100, 100},
  };
  return fields;
}

std::string field_text(const Config& c, const ConfigField& f) {
  return std::visit(
      [&](auto m) -> std::string {
        if constexpr (std::is_same_v<decltype(m), NormKind Config::*>) return norm_name(c.*m);
        else return fmt::format("{}", c.*m);
      },
      f.member);
}

}  // namespace pwm::model
