// Model presets: named model shapes from the reference model to GPT-2 small's, each with a
// learning rate and warm-up that train it (docs/model.md, "Presets"). `--preset NAME` on any
// trainer's command line sets them first; a --config file and the other flags override any of
// them. Parameter counts are computed (model::Config::num_params), not written down.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace pwm::train {

struct Preset {
  const char* name;      // "30m"
  const char* about;     // one line for --help
  int64_t d_model, n_layers, n_heads, head_dim, d_ff, seq_len;
  double lr;
  int64_t warmup_steps;  // at most half of --steps unless --warmup-steps is given
};

const std::vector<Preset>& presets();
// The preset named `name`; throws pwm::Error naming the presets when there is none.
const Preset& find_preset(const std::string& name);
// Sets the preset's model shape, learning rate and warm-up on `cfg`.
void apply_preset(const Preset& p, TrainConfig& cfg);
// The model a preset gives over `base`'s other settings (the vocabulary, MoE fields).
model::Config preset_model(const Preset& p, model::Config base = {});
// "4m (3.9M parameters: d_model 256, 4 layers, ...), ..." for --help and error lines.
std::string describe_presets();

}  // namespace pwm::train
