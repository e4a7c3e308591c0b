// model::Config's fields, declared once. From this table come the flags and their --help
// (train/flags.cc), the checkpoint's config, its reading and the check that a checkpoint fits
// the run (train/checkpoint.cc), the configuration every rank must agree on (train/config.cc),
// the flags' bounds (train/config.cc) and Config::to_string. A new field is one row here.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "model/config.h"

namespace pwm::model {

struct ConfigField {
  enum class Group { kModel, kMoe };  // --help's group; to_string prints the MoE fields only for an MoE model
  using Member = std::variant<int64_t Config::*, uint64_t Config::*, double Config::*, NormKind Config::*>;
  const char* key;   // the checkpoint's and the canonical config's JSON key, and to_string's
  const char* flag;  // "--d-model"
  const char* help;
  Group group;
  Member member;
  // The flag's accepted range (a number field; an infinite bound is none), as TrainConfig checks
  // it under the flag's name. `bounded` false: checked elsewhere (model::Config::validate_moe).
  bool bounded = false;
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool open_lo = false, open_hi = false;
};

const std::vector<ConfigField>& config_fields();

// A field's value as to_string and the checkpoint's mismatch line print it.
std::string field_text(const Config& c, const ConfigField& f);

}  // namespace pwm::model
