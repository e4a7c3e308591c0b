// Strict numbers (common/parse.h), the command line's errors in the project's words
// (common/cli.h), path identity (common/paths.h), the one line for a library's exception
// (common/check.h) and the trainers' config file keys (train/flags.h). The end-to-end cases under
// mpirun are tests/spmd/input_cases.py.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/cli.h"
#include "common/parse.h"
#include "common/paths.h"
#include "tests/model/temp_dir.h"
#include "train/flags.h"

namespace pwm {
namespace {

using model::testing::TempDir;

TEST(StrictNumbers, WholeNumbers) {
  EXPECT_EQ(check_whole_number("100"), "");
  EXPECT_EQ(check_whole_number("-7"), "");
  EXPECT_EQ(check_whole_number("+7"), "");
  EXPECT_EQ(check_whole_number("0"), "");
  EXPECT_EQ(check_whole_number("9223372036854775807"), "");
  EXPECT_NE(check_whole_number("9223372036854775808"), "");  // one past INT64_MAX
  EXPECT_EQ(check_whole_number("18446744073709551615", false), "");
  EXPECT_NE(check_whole_number("18446744073709551616", false), "");
  for (const char* bad : {"", "-", "5x", "3.5", "1e3", " 5", "5 ", "0x10", "010", "--5"})
    EXPECT_NE(check_whole_number(bad), "") << bad;
  EXPECT_NE(check_whole_number("-1", false), "");
  EXPECT_EQ(parse_whole("--n", "42", 1, 100), 42);
  EXPECT_THROW(parse_whole("--n", "0", 1, 100), Error);
  EXPECT_THROW(parse_whole("--n", "2junk"), Error);
}

TEST(StrictNumbers, RealNumbers) {
  for (const char* ok : {"0.5", "3e-4", "-2", "1", "1e308"}) EXPECT_EQ(check_real_number(ok), "") << ok;
  for (const char* bad : {"", "inf", "-inf", "nan", "NaN", "1e400", "1e-3junk", "0.5 ", "x", "0x10", "0x1p-3"})
    EXPECT_NE(check_real_number(bad), "") << bad;
  EXPECT_DOUBLE_EQ(parse_real("--x", "0.25"), 0.25);
  EXPECT_THROW(parse_real("--x", "1,5"), Error);
}

// Parses argv with the strict checks; returns the error line ("" if it parsed).
std::string parse(std::vector<std::string> args) {
  CLI::App app{"test", "prog"};
  int64_t steps = 1;
  uint64_t seed = 0;
  double lr = 0;
  bool on = false;
  std::string mode = "a";
  app.add_option("--steps", steps);
  app.add_option("--seed", seed);
  app.add_option("--lr", lr);
  app.add_flag("--on", on);
  app.add_option("--mode", mode)->check(CLI::IsMember({"a", "b"}));
  std::vector<char*> argv{const_cast<char*>("prog")};
  for (auto& a : args) argv.push_back(a.data());
  int code = 0;
  try {
    parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "prog", false, code);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLine, NumbersAreStrict) {
  EXPECT_EQ(parse({"--steps", "5", "--seed", "3", "--lr", "1e-3"}), "");
  EXPECT_EQ(parse({"--steps", "99999999999999999999"}),
            "--steps: '99999999999999999999' is too large for a 64-bit whole number (see prog --help)");
  EXPECT_EQ(parse({"--seed", "-1"}), "--seed: '-1' is negative; expected a whole number >= 0 (see prog --help)");
  EXPECT_EQ(parse({"--lr", "inf"}), "--lr: 'inf' is not a finite number (see prog --help)");
  EXPECT_EQ(parse({"--steps", "4", "--steps", "5x"}),
            "--steps: '5x' is not a whole number (decimal digits, e.g. 100) (see prog --help)");
}

TEST(CommandLine, ErrorsAreInTheProjectsWords) {
  EXPECT_EQ(parse({"--bogus"}), "--bogus is not a flag of prog (see prog --help)");
  EXPECT_EQ(parse({"--bogus=3"}), "--bogus is not a flag of prog (see prog --help)");
  EXPECT_EQ(parse({"--lr"}), "--lr needs a value (see prog --help)");
  EXPECT_EQ(parse({"--mode", "c"}), "--mode 'c': expected one of a, b (see prog --help)");
  EXPECT_NE(parse({"stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(parse({"--on=maybe"}).find("--on 'maybe'"), std::string::npos) << parse({"--on=maybe"});
}

TEST(ErrorLine, LibraryExceptionsAreNamed) {
  EXPECT_EQ(error_line(Error("--x: bad")), "--x: bad");
  EXPECT_NE(error_line(std::bad_alloc()).find("out of memory"), std::string::npos);
  EXPECT_EQ(error_line(std::bad_alloc()).find("std::"), std::string::npos);
  EXPECT_NE(error_line(std::out_of_range("vector::at")).find("internal error"), std::string::npos);
}

TEST(Paths, SameFileAndInsideDirectory) {
  TempDir t;
  const std::string a = t.path().string() + "/a.txt", link = t.path().string() + "/link.txt", sub = t.path().string() + "/sub";
  std::ofstream(a) << "x";
  ASSERT_EQ(::symlink(a.c_str(), link.c_str()), 0);
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  EXPECT_TRUE(same_file(a, link));
  EXPECT_TRUE(same_file(a, t.path().string() + "/./sub/../a.txt"));
  EXPECT_TRUE(same_file(t.path().string() + "/new.json", t.path().string() + "/sub/../new.json"));  // neither exists
  EXPECT_FALSE(same_file(a, t.path().string() + "/b.txt"));
  EXPECT_TRUE(inside_directory(sub + "/m.jsonl", t.path().string()));
  EXPECT_TRUE(inside_directory(a, t.path().string()));
  EXPECT_FALSE(inside_directory(t.path().string() + "x/m.jsonl", t.path().string()));  // a sibling with a longer name
  EXPECT_FALSE(inside_directory(a, sub));
}

TEST(Paths, InputFilesAreCheckedWithoutOpening) {
  TempDir t;
  const std::string fifo = t.path().string() + "/fifo", big = t.path().string() + "/big", ok = t.path().string() + "/ok";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::ofstream(ok) << "{}";
  std::ofstream(big).close();
  ASSERT_EQ(::truncate(big.c_str(), 1 << 21), 0);
  EXPECT_NO_THROW(check_input_file("--config", ok, 1 << 20));
  try {
    check_input_file("--config", fifo, 1 << 20);  // would block in open(2)
    FAIL() << "a FIFO was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a FIFO (named pipe), not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_input_file("--config", big, 1 << 20), Error);
  EXPECT_THROW(check_input_file("--config", t.path().string(), 1 << 20), Error);
  EXPECT_NO_THROW(check_input_file("--data", t.path().string(), 1 << 20, /*directory_ok=*/true));
  EXPECT_THROW(check_input_file("--config", t.path().string() + "/missing", 1 << 20), Error);
}

std::string config_error(const std::string& text, train::FlagSet set = train::FlagSet::kSpmd) {
  train::TrainConfig cfg;
  try {
    train::parse_train_config_text(text, "c.json", cfg, set, "spmd_train");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigFile, KeysAreTheTrainersFlags) {
  EXPECT_EQ(config_error(R"({"lr": 0.001, "steps": 3, "fsdp": true})"), "");
  EXPECT_NE(config_error(R"({"bogus": 1})").find("key 'bogus' is not a flag of spmd_train"), std::string::npos);
  EXPECT_NE(config_error(R"({"granularity": "fused"})").find("key 'granularity'"), std::string::npos);
  EXPECT_EQ(config_error(R"({"granularity": "chained"})", train::FlagSet::kPathways), "");
  EXPECT_NE(config_error(R"({"config": "x.json"})").find("cannot be set from a config file"), std::string::npos);
  EXPECT_NE(config_error(R"({"help": true})").find("cannot be set from a config file"), std::string::npos);
  EXPECT_NE(config_error(R"({"steps": "5x"})").find("--steps: '5x' is not a whole number"), std::string::npos);
  const std::string cut = config_error(R"({"lr": )");
  EXPECT_NE(cut.find("is not valid JSON (it ends early)"), std::string::npos) << cut;
  EXPECT_EQ(cut.find("json.exception"), std::string::npos) << cut;
}

}  // namespace
}  // namespace pwm
