#include "train/presets.h"

#include <fmt/format.h>

#include "common/check.h"

namespace pwm::train {

// The reference model is the defaults (model::Config, model::AdamWConfig). The larger ones' rates
// were checked over 50 steps at compare.sh's batches (docs/results/presets.md): 6e-4 at ~30M
// (nanoGPT's rate for its small models); at ~100M GPT-2's 6e-4 is for 0.5M-token batches, and
// 3e-4 with 12 warm-up steps spiked at 4096 tokens a step (step 11: +0.74), so 2e-4 over 20.
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"4m", "the reference model (the defaults)", 256, 4, 4, 64, 1024, 128, 1e-3, 0},
      {"30m", "a model of ~30M parameters", 512, 8, 8, 64, 2048, 256, 6e-4, 10},
      {"100m", "GPT-2 small's shape over bytes", 768, 12, 12, 64, 3072, 512, 2e-4, 20},
  };
  return p;
}

model::Config preset_model(const Preset& p, model::Config m) {
  m.d_model = p.d_model;
  m.n_layers = p.n_layers;
  m.n_heads = p.n_heads;
  m.head_dim = p.head_dim;
  m.d_ff = p.d_ff;
  m.seq_len = p.seq_len;
  return m;
}

std::string describe_presets() {
  std::string s;
  for (const Preset& p : presets()) {
    const model::Config m = preset_model(p);
    s += fmt::format("{}{} ({:.1f}M parameters, {}: d_model {}, {} layers, {} heads of {}, d_ff {}, seq_len {}; lr {:g}, "
                     "warm-up {})",
                     s.empty() ? "" : "; ", p.name, static_cast<double>(m.num_params()) / 1e6, p.about, p.d_model,
                     p.n_layers, p.n_heads, p.head_dim, p.d_ff, p.seq_len, p.lr, p.warmup_steps);
  }
  return s;
}

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (name == p.name) return p;
  std::string names;
  for (const Preset& p : presets()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  PWM_THROW("--preset {} is not a preset: use one of {} (docs/model.md, \"Presets\")", name, names);
}

void apply_preset(const Preset& p, TrainConfig& cfg) {
  cfg.model = preset_model(p, cfg.model);
  cfg.optim.lr = p.lr;
  cfg.optim.warmup_steps = p.warmup_steps;
}

}  // namespace pwm::train
