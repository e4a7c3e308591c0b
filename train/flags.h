// The trainers' flags and --config files: one CLI11 parser fills a TrainConfig (train/config.h),
// so every trainer accepts the same workload flags and config keys by construction.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "train/config.h"

namespace CLI {
class App;
}

namespace pwm::train {

// Which trainer's flags: every trainer registers the common ones (model, optimizer, workload,
// outputs, execution, testing) and only the flags of its own that it uses; a flag of another
// trainer is refused in one line that names the trainer it belongs to (docs/errors.md has the
// table; each field's row in train/config_fields.h names the trainers that register it). The MPMD
// trainers share --granularity, --stages, --schedule and --moe-routing.
enum class FlagSet {
  kSpmd,      // spmd_train (and the tools that parse a workload): --replica-reduce
  kPathways,  // pathways_train: the MPMD flags, --islands, --sequential, --expert-island, --spare-workers
  kStatic,    // mpmd_train: the MPMD flags, --quota
};
bool is_mpmd(FlagSet set);

// Registers the flags of `set` on `app`, bound to `cfg`. `--config FILE` is handled by
// parse_train_config below.
void add_train_flags(CLI::App& app, TrainConfig& cfg, FlagSet set = FlagSet::kSpmd);

// Parses argv into a TrainConfig: applies --preset NAME first if given (train/presets.h), then
// loads --config FILE if given (keys: the flags of `set`), then applies the flags of `set`. Numbers are read strictly (common/cli.h).
// Returns false if the program should exit (--help printed): `exit_code` is then set.
// Throws pwm::Error on a bad flag, a bad file or an invalid value.
// `more_flags` registers a program's own flags (the simulator's) on the same parser.
bool parse_train_config(int argc, char** argv, const std::string& program, const std::string& description,
                        TrainConfig& cfg, int& exit_code, bool print_help,
                        const std::function<void(CLI::App&)>& more_flags = {}, FlagSet set = FlagSet::kSpmd);

// Loads a JSON config file (the keys are the long flag names without "--", those of `set`;
// `config` and `help` are refused). The file must be a regular file of at most 1 MiB, checked
// before it is opened. Throws pwm::Error naming the file and the bad key or value; `program`
// names the trainer in those lines.
void load_train_config_file(const std::string& path, TrainConfig& cfg, FlagSet set = FlagSet::kSpmd,
                            const std::string& program = "this trainer");
// The same on the file's text already in memory; `path` only names it in errors.
void parse_train_config_text(std::string_view text, const std::string& path, TrainConfig& cfg,
                             FlagSet set = FlagSet::kSpmd, const std::string& program = "this trainer");

}  // namespace pwm::train
