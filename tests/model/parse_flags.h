// Test helper: a trainer's command line parsed as parse_train_config does (train/flags.h).
#pragma once

#include <string>
#include <vector>

#include "common/check.h"
#include "train/flags.h"

namespace pwm::train::testing {

// Parses `args` (without the program name) as trainer `set`'s command line into `cfg`; "" or the
// error line.
inline std::string parse_flags(std::vector<std::string> args, TrainConfig& cfg, FlagSet set = FlagSet::kSpmd) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int exit_code = 0;
  try {
    parse_train_config(static_cast<int>(args.size()), argv.data(), "prog", "", cfg, exit_code, false, {}, set);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace pwm::train::testing
