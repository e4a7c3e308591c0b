// model::Config as JSON, field by field from the one table (model/config_fields.h): the
// checkpoint's "config" (train/checkpoint.cc) and the "model" part of the configuration every rank
// must agree on (TrainConfig::canonical_json).
#pragma once

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace pwm::train {

nlohmann::json model_to_json(const model::Config& c);
// The MoE fields may be absent (a dense model's checkpoint written before them): the defaults.
// A missing or mistyped other field throws nlohmann::json's exception (the caller names the file).
model::Config model_from_json(const nlohmann::json& j);
// Throws pwm::Error naming the first field where `have` (the checkpoint's, at `path`) differs
// from `want` (this run's).
void check_same_model(const model::Config& have, const model::Config& want, const std::string& path);

}  // namespace pwm::train
