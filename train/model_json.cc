#include "train/model_json.h"

#include "common/check.h"
#include "model/config_fields.h"

namespace pwm::train {

using model::Config;
using model::ConfigField;

nlohmann::json model_to_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const ConfigField& f : model::config_fields())
    std::visit(
        [&](auto m) {
          if constexpr (std::is_same_v<decltype(m), model::NormKind Config::*>) j[f.key] = model::norm_name(c.*m);
          else j[f.key] = c.*m;
        },
        f.member);
  return j;
}

Config model_from_json(const nlohmann::json& j) {
  Config c;
  for (const ConfigField& f : model::config_fields()) {
    const bool optional = f.group == ConfigField::Group::kMoe;
    if (optional && !j.contains(f.key)) continue;
    const nlohmann::json& v = j.at(f.key);
    std::visit(
        [&](auto m) {
          using T = std::remove_reference_t<decltype(c.*m)>;
          if constexpr (std::is_same_v<T, model::NormKind>) c.*m = model::parse_norm(v.get<std::string>());
          else c.*m = v.get<T>();
        },
        f.member);
  }
  return c;
}

void check_same_model(const Config& have, const Config& want, const std::string& path) {
  for (const ConfigField& f : model::config_fields()) {
    const std::string h = model::field_text(have, f), w = model::field_text(want, f);
    if (h != w)
      PWM_THROW("checkpoint {} was written for {}={} but this run has {}={}; resume with the checkpoint's model config "
                "or start a new run",
                path, f.key, h, f.key, w);
  }
}

}  // namespace pwm::train
