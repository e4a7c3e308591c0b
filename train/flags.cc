#include "train/flags.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <vector>

#include "common/check.h"
#include "common/cli.h"
#include "common/env.h"
#include "common/paths.h"
#include "model/config_fields.h"
#include "train/presets.h"
#include "train/config_fields.h"

namespace pwm::train {

namespace {

// An enum flag: CLI11 checks the text against `names` (its usual one-line error), then `set`
// parses it (train/modes.h). `shown` is the default --help prints.
template <typename Set>
CLI::Option* add_mode(CLI::App& app, const std::string& flag, Set set, const std::vector<std::string>& names,
                      const std::string& help, const std::string& shown) {
  return app.add_option_function<std::string>(flag, set, help)->check(CLI::IsMember(names))->default_str(shown);
}

// One row of train/config_fields.h, bound to its member of `part`: a switch (with --no-X when
// negatable), an enum through its Mode, any other value as a CLI11 option of its type (which
// picks the strict number check, common/cli.h).
template <typename Part>
CLI::Option* add_field(CLI::App& app, Part& part, const Field<Part>& f) {
  return std::visit(
      [&](auto m) -> CLI::Option* {
        using T = std::remove_reference_t<decltype(part.*m)>;
        T& v = part.*m;
        if constexpr (std::is_same_v<T, bool>) {
          const std::string name = f.traits & kNegatable ? fmt::format("{},!--no-{}", f.flag, f.flag + 2) : f.flag;
          return app.add_flag(name, v, f.help);
        } else if constexpr (std::is_enum_v<T>) {
          return add_mode(app, f.flag, [&v](const std::string& s) { v = Mode<T>::parse(s); }, Mode<T>::names(), f.help,
                          Mode<T>::name(v));
        } else {
          return app.add_option(f.flag, v, f.help);
        }
      },
      f.member);
}

}  // namespace

void add_train_flags(CLI::App& app, TrainConfig& c, FlagSet set) {
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // The model's fields, from their one table (model/config_fields.h).
  for (const model::ConfigField& f : model::config_fields()) {
    const char* group = f.group == model::ConfigField::Group::kModel ? "Model" : "Mixture of Experts";
    std::visit(
        [&](auto m) {
          if constexpr (std::is_same_v<decltype(m), model::NormKind model::Config::*>)
            app.add_option_function<std::string>(
                   f.flag, [&c, m](const std::string& s) { c.model.*m = model::parse_norm(s); }, f.help)
                ->group(group);
          else
            app.add_option(f.flag, c.model.*m, f.help)->group(group);
        },
        f.member);
  }
  // The other parts' fields, from their tables (train/config_fields.h): those of `set`, group by
  // group in --help's order (CLI11 prints a group's options in the order they were added).
  for (FieldGroup g : kFieldGroups)
    for_each_part(c, [&](auto& part, const auto& rows, const char*) {
      for (const auto& f : rows)
        if (f.flag != nullptr && f.group == g && registers(f.trainers, set)) add_field(app, part, f)->group(group_name(g));
    });
}

bool is_mpmd(FlagSet set) { return set != FlagSet::kSpmd; }

namespace {

const char* trainer_of(FlagSet s) {
  switch (s) {
    case FlagSet::kSpmd: return "spmd_train";
    case FlagSet::kPathways: return "pathways_train";
    case FlagSet::kStatic: return "mpmd_train";
  }
  return "?";
}

// The trainers other than `set`'s that have `flag` ("--islands"), in words ("pathways_train's");
// "" when none has it.
std::string owners(const std::string& flag, FlagSet set) {
  std::string who;
  for (FlagSet s : {FlagSet::kSpmd, FlagSet::kPathways, FlagSet::kStatic}) {
    if (s == set) continue;
    CLI::App other;
    TrainConfig c;
    add_train_flags(other, c, s);
    if (other.get_option_no_throw(flag) == nullptr) continue;
    who += fmt::format("{}{}'s", who.empty() ? "" : " and ", trainer_of(s));
  }
  return who;
}

// A flag this trainer does not have but another one does: refused naming its owner (CLI11's own
// line would only say it is not a flag of this one).
void refuse_foreign_flags(const CLI::App& app, int argc, char** argv, FlagSet set, const std::string& program) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) continue;
    const std::string flag = a.substr(0, a.find('='));
    if (app.get_option_no_throw(flag) != nullptr) continue;
    const std::string who = owners(flag, set);
    if (!who.empty())
      PWM_THROW("{} is {}, not a flag of {}: leave it out (see {} --help)", flag, who, program, program);
  }
}

// Flags a config file cannot set: the file itself and --help.
bool reserved_key(const std::string& key) { return key == "config" || key == "preset" || key == "help" || key == "h"; }

std::vector<std::string> preset_names() {
  std::vector<std::string> v;
  for (const Preset& p : presets()) v.push_back(p.name);
  return v;
}

// The preset `--preset NAME` (or `--preset=NAME`) names, if any (the last one given); throws
// naming the presets when NAME is none. A bare `--preset` is CLI11's to refuse.
const Preset* preset_argument(int argc, char** argv) {
  const Preset* p = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--preset" && i + 1 < argc) p = &find_preset(argv[++i]);
    else if (a.rfind("--preset=", 0) == 0) p = &find_preset(a.substr(9));
  }
  return p;
}

// JSON config -> "--key=value" arguments, so that the file and the flags share one parser. Every
// key must be a flag of `app` (the trainer's own set), named without its dashes.
std::vector<std::string> json_to_args(std::string_view text, const std::string& path, const CLI::App& app,
                                      FlagSet set, const std::string& program) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const std::string where = e.byte >= text.size() ? "it ends early" : fmt::format("at byte {}", e.byte);
    PWM_THROW("--config {} is not valid JSON ({}): it must hold one object such as {{\"lr\": 3e-4, \"steps\": 100}}",
              path, where);
  } catch (const std::exception&) {
    PWM_THROW("--config {} is not valid JSON: it must hold one object such as {{\"lr\": 3e-4, \"steps\": 100}}", path);
  }
  if (!j.is_object()) PWM_THROW("--config {} must hold one JSON object of flag names to values", path);
  std::vector<std::string> args;
  for (auto& [key, v] : j.items()) {
    if (reserved_key(key))
      PWM_THROW("--config {}: key '{}' cannot be set from a config file{}", path, key,
                key == "preset" ? " (give --preset on the command line: the file's keys then override it)" : "");
    if (app.get_option_no_throw("--" + key) == nullptr && !owners("--" + key, set).empty())
      PWM_THROW("--config {}: key '{}' is {}, not a flag of {}: leave it out", path, key, owners("--" + key, set), program);
    if (app.get_option_no_throw("--" + key) == nullptr)
      PWM_THROW("--config {}: key '{}' is not a flag of {} (keys are flag names without the dashes, e.g. "
                "\"seq-len\"; see {} --help)",
                path, key, program, program);
    std::string val;
    if (v.is_string()) val = v.get<std::string>();
    else if (v.is_boolean()) val = v.get<bool>() ? "true" : "false";
    else if (v.is_number()) val = v.dump();
    else PWM_THROW("--config {}: key '{}' must be a string, number or boolean", path, key);
    args.push_back("--" + key + "=" + val);
  }
  return args;
}

// A config file is read whole on every rank: a regular file of at most this size, checked before
// it is opened (a FIFO would block the rank in open(2) while the others have refused it).
constexpr uintmax_t kMaxConfigBytes = 1 << 20;

std::string read_config_file(const std::string& path) {
  check_input_file("--config", path, kMaxConfigBytes);
  std::ifstream in(path);
  if (!in) PWM_THROW("cannot read --config {}: check the path", path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) PWM_THROW("cannot read --config {}: check the path", path);
  return text;
}

}  // namespace

void load_train_config_file(const std::string& path, TrainConfig& cfg, FlagSet set, const std::string& program) {
  parse_train_config_text(read_config_file(path), path, cfg, set, program);
}

void parse_train_config_text(std::string_view text, const std::string& path, TrainConfig& cfg, FlagSet set,
                             const std::string& program) {
  CLI::App app{"", program};
  add_train_flags(app, cfg, set);
  auto args = json_to_args(text, path, app, set, program);
  for (const std::string& a : args) cfg.given_flags.push_back(a.substr(0, a.find('=')));
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  parse_arguments(app, std::move(args), "--config " + path);
}

bool parse_train_config(int argc, char** argv, const std::string& program, const std::string& description,
                        TrainConfig& cfg, int& exit_code, bool print_help,
                        const std::function<void(CLI::App&)>& more_flags, FlagSet set) {
  // The environment's settings are the defaults, a config file overrides them, and flags on
  // the command line override both. This is the one place a trainer resolves them.
  cfg.exec.coll_timeout = env_double("PWM_COLL_TIMEOUT", cfg.exec.coll_timeout);
  // --preset first (its values are defaults), then --config, so that a file overrides a preset
  // and flags on the command line override both.
  const Preset* preset = preset_argument(argc, argv);
  if (preset) apply_preset(*preset, cfg);
  const int64_t preset_warmup = cfg.optim.warmup_steps;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) cfg.config_file = argv[i + 1];
    else if (a.rfind("--config=", 0) == 0) cfg.config_file = a.substr(9);
    else continue;
    load_train_config_file(cfg.config_file, cfg, set, program);
  }
  const bool file_set_warmup = cfg.optim.warmup_steps != preset_warmup;
  CLI::App app{description, program};
  std::string config_path, preset_name;
  app.add_option("--config", config_path, "JSON file of flag values (flags override it)");
  app.add_option("--preset", preset_name,
                 "model shape, learning rate and warm-up, set before --config and the other flags: " + describe_presets())
      ->check(CLI::IsMember(preset_names()));
  add_train_flags(app, cfg, set);
  if (more_flags) more_flags(app);
  refuse_foreign_flags(app, argc, argv, set, program);
  if (!parse_command_line(app, argc, argv, program, print_help, exit_code)) return false;
  for (int i = 1; i < argc; ++i) {  // (every "--x" is one of app's flags: the parse succeeded)
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && a.size() > 2) cfg.given_flags.push_back(a.substr(0, a.find('=')));
  }
  // A preset's warm-up fits a short run: at most half of its steps, unless set.
  if (preset && !file_set_warmup && app.count("--warmup-steps") == 0)
    cfg.optim.warmup_steps = std::min(preset->warmup_steps, cfg.workload.steps / 2);
  cfg.optim.total_steps = cfg.workload.steps;
  return true;
}

}  // namespace pwm::train
