// Issue 59: a flag the run's configuration does not use is refused (train/flag_use.h). For every
// row and every trainer that has the row's flag: given alone (with the row's disabling flags) it is refused in one line naming it;
// with the row's enabling flags the same command line passes. docs/errors.md's table lists every
// row's flags, and a flag given at its default value is refused as well (given is given).
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/model/parse_flags.h"
#include "train/flag_use.h"

namespace pwm::train {
namespace {

using testing::parse_flags;
constexpr FlagSet kSets[] = {FlagSet::kSpmd, FlagSet::kPathways, FlagSet::kStatic};

// A value each row's flag accepts ("": a switch). A row's new flag without one fails the test.
const std::map<std::string, std::string> kExample = {
    {"--top-k", "1"},          {"--moe-every", "1"},       {"--capacity-factor", "2"}, {"--aux-loss", "0.1"},
    {"--router-z-loss", "0.1"}, {"--router-skew", "1"},     {"--expert-parallel", "1"}, {"--moe-routing", "static"},
    {"--expert-island", ""},   {"--schedule", "1f1b"},     {"--quota", "2"},           {"--granularity", "chained"},
    {"--replica-reduce", "flat"}, {"--bucket-bytes", "4096"}, {"--overlap", ""},      {"--no-overlap", ""},
    {"--kill-rank", "0"},      {"--kill-signal", "stop"},  {"--straggler-rank", "0"},
};

bool has_flag(FlagSet set, const std::string& flag) {
  TrainConfig cfg;
  CLI::App app;
  add_train_flags(app, cfg, set);
  const std::string name = flag.rfind("--no-", 0) == 0 ? "--" + flag.substr(5) : flag;
  return app.get_option_no_throw(name) != nullptr;
}

// The error line refuse_unused_flags throws after parsing `args`, "" if none.
std::string refusal(const std::vector<std::string>& args, FlagSet set) {
  TrainConfig cfg;
  const std::string parse_error = parse_flags(args, cfg, set);
  EXPECT_EQ(parse_error, "") << args.front();
  try {
    refuse_unused_flags(cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FlagUse, EachRowsFlagsAreRefusedUnlessTheirConfigurationUsesThem) {
  int checked = 0;
  for (const FlagUse& row : flag_uses())
    for (const std::string& flag : row.flags) {
      const auto ex = kExample.find(flag);
      if (ex == kExample.end()) {
        ADD_FAILURE() << flag << " has no example value in this test";
        continue;
      }
      std::vector<std::string> args = row.disabling;
      args.push_back(flag);
      if (!ex->second.empty()) args.push_back(ex->second);
      for (FlagSet set : kSets) {
        if (!has_flag(set, flag)) continue;
        const std::string line = refusal(args, set);
        EXPECT_NE(line.find(flag + " applies to " + row.applies_to), std::string::npos) << flag << ": " << line;
        EXPECT_NE(line.find("leave " + flag + " out"), std::string::npos) << line;
        std::vector<std::string> used = args;  // (the last of a repeated flag wins)
        used.insert(used.end(), row.enabling.begin(), row.enabling.end());
        EXPECT_EQ(refusal(used, set), "") << flag << " with its enabling flags";
        ++checked;
      }
    }
  EXPECT_GE(checked, 19);  // every flag above on at least one trainer
}

TEST(FlagUse, GivenAtItsDefaultOrInAConfigFileIsGivenToo) {
  // --capacity-factor 1.25 is the default: on a dense model it still does nothing.
  EXPECT_NE(refusal({"--capacity-factor", "1.25"}, FlagSet::kSpmd).find("--capacity-factor applies to"),
            std::string::npos);
  TrainConfig cfg;
  parse_train_config_text(R"({"top-k": 2, "lr": 0.001})", "c.json", cfg, FlagSet::kSpmd, "spmd_train");
  EXPECT_EQ(cfg.given_flags, (std::vector<std::string>{"--lr", "--top-k"}));
  EXPECT_THROW(refuse_unused_flags(cfg), Error);
}

TEST(FlagUse, FlagsEveryConfigurationUsesPass) {
  for (FlagSet set : kSets)
    EXPECT_EQ(refusal({"--lr", "1e-3", "--steps", "3", "--warmup-steps", "1", "--seed", "2", "--dp", "1", "--tp", "1",
                       "--microbatches", "1", "--eval-every", "1", "--precision", "fp32", "--kill-step", "1",
                       "--straggler-ms", "0", "--experts", "0"},
                      set),
              "");
  // A MoE run with its flags, a pipeline with its schedule.
  EXPECT_EQ(refusal({"--experts", "4", "--top-k", "1", "--capacity-factor", "0", "--moe-routing", "worker"},
                    FlagSet::kStatic),
            "");
  EXPECT_EQ(refusal({"--stages", "2", "--schedule", "gpipe", "--quota", "4"}, FlagSet::kStatic), "");
}

TEST(FlagUse, DocsTableListsEveryRowsFlags) {
  std::ifstream in(PWM_ERRORS_MD);
  std::string line, table;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("| flag | applies to |", 0) == 0) inside = true;
    else if (inside && line.rfind("|", 0) != 0) break;
    if (inside) table += line + "\n";
  }
  ASSERT_FALSE(table.empty()) << PWM_ERRORS_MD << " has no table \"| flag | applies to |\"";
  for (const FlagUse& row : flag_uses()) {
    for (const std::string& flag : row.flags)
      EXPECT_NE(table.find("`" + flag + "`"), std::string::npos) << flag << " is not in docs/errors.md's table";
    EXPECT_NE(table.find(row.applies_to), std::string::npos) << row.applies_to;
  }
}

}  // namespace
}  // namespace pwm::train
