// Which configuration uses which flag: a flag given (on the command line or as a --config key)
// to a run whose configuration never reads it is refused in one line, so that `--top-k 4` on a
// dense model or `--schedule 1f1b` without a pipeline cannot look as if it did something.
// docs/errors.md's table "Flags that belong to one configuration" lists these rows.
//
// Which trainer has a flag at all is train/flags.h's (a flag of another trainer is refused
// there); this is the next question, asked of the flags the trainer has.
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace pwm::train {

struct FlagUse {
  std::vector<std::string> flags;  // "--top-k"; a switch's two forms each ("--overlap", "--no-overlap")
  const char* applies_to;          // "Mixture-of-Experts models"
  const char* fix;                 // "add --experts E"
  bool (*used)(const TrainConfig&);
  // For the tests: flags that make a run use `flags` ({"--experts", "4"}), and flags with which
  // it does not (empty: the defaults do not).
  std::vector<std::string> enabling, disabling = {};
};

// Every row, in docs/errors.md's order.
const std::vector<FlagUse>& flag_uses();

// Throws pwm::Error, one line, for the first flag of `given` (flag names as the user wrote
// them, "--top-k"; TrainConfig::given_flags) that a row covers and `cfg` does not use:
// "--top-k applies to Mixture-of-Experts models: add --experts E, or leave --top-k out".
// Called by every trainer after parsing, on every rank (train/bootstrap.cc).
void refuse_unused_flags(const TrainConfig& cfg);

}  // namespace pwm::train
