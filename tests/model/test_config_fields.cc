// The tables of TrainConfig's fields (train/config_fields.h) against what is derived from them:
// each flag registered by exactly the trainers its row names (those docs/errors.md names), the
// JSON keys unique, each range's error line naming its flag, and a round trip (a flag's value
// read back from canonical_json under the row's key) that fails for a row bound to the wrong member.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.h"
#include "model/config_fields.h"
#include "tests/model/parse_flags.h"
#include "tests/model/temp_dir.h"
#include "train/config.h"
#include "train/config_fields.h"
#include "train/flags.h"

namespace pwm::train {
namespace {

using model::testing::error_of;
constexpr FlagSet kSets[] = {FlagSet::kSpmd, FlagSet::kPathways, FlagSet::kStatic};

const char* trainer_name(FlagSet s) {
  return s == FlagSet::kSpmd ? "spmd_train" : s == FlagSet::kPathways ? "pathways_train" : "mpmd_train";
}

// The type of a member pointer's field.
template <typename M>
struct field_type;
template <typename C, typename T>
struct field_type<T C::*> {
  using type = T;
};

// The part of `c` that a table's rows are members of.
template <typename Part>
Part& part_of(TrainConfig& c) {
  if constexpr (std::is_same_v<Part, model::AdamWConfig>) return c.optim;
  else if constexpr (std::is_same_v<Part, MeshConfig>) return c.mesh;
  else if constexpr (std::is_same_v<Part, ExecConfig>) return c.exec;
  else if constexpr (std::is_same_v<Part, WorkloadConfig>) return c.workload;
  else if constexpr (std::is_same_v<Part, OutputConfig>) return c.outputs;
  else if constexpr (std::is_same_v<Part, TestHooks>) return c.hooks;
  else return c.mpmd;
}

// Calls fn(row, object) for every row of every part's table.
template <typename Fn>
void for_each_row(Fn&& fn) {
  const TrainConfig c;
  for_each_part(c, [&](const auto&, const auto& rows, const char* object) {
    for (const auto& f : rows) fn(f, object);
  });
}

// The row's place in canonical_json, as nlohmann's flatten() names it: "/optim/lr", "/batch".
std::string path_of(const char* object, const char* key) {
  return object != nullptr ? fmt::format("/{}/{}", object, key) : fmt::format("/{}", key);
}

// Parses `args` as trainer `set`'s command line; "" or the error line.
std::string parse(std::vector<std::string> args, FlagSet set, TrainConfig& cfg) {
  return testing::parse_flags(std::move(args), cfg, set);
}

TEST(ConfigFields, RowsAreWellFormedAndKeysUnique) {
  std::set<std::string> paths = {"/model"}, flags;
  for (const model::ConfigField& f : model::config_fields()) flags.insert(f.flag);
  for_each_row([&](const auto& f, const char* object) {
    EXPECT_TRUE(paths.insert(path_of(object, f.key)).second) << "JSON key " << path_of(object, f.key) << " twice";
    // A row without a flag (a value copied from another field's) is registered by no trainer.
    if (f.flag == nullptr) {
      EXPECT_EQ(f.trainers, 0u) << f.key;
      EXPECT_FALSE(f.range.bounded) << f.key;
      return;
    }
    EXPECT_TRUE(flags.insert(f.flag).second) << f.flag << " twice";
    EXPECT_EQ(std::string(f.flag).rfind("--", 0), 0u) << f.flag;
    EXPECT_NE(f.trainers, 0u) << f.flag;
    EXPECT_EQ(f.trainers & ~trainers::kAll, 0u) << f.flag;
    // The MPMD settings are written as texts under "trainer", and only they are.
    EXPECT_EQ(f.json == FieldJson::kTrainer, object != nullptr && std::string(object) == "trainer") << f.flag;
    std::visit(
        [&](auto m) {
          using T = typename field_type<decltype(m)>::type;
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            EXPECT_TRUE(!f.range.bounded || (std::isinf(f.range.hi) && !f.range.open_lo)) << f.flag << ": a lower bound only";
          } else if constexpr (!std::is_same_v<T, double>) {
            EXPECT_FALSE(f.range.bounded) << f.flag << ": a range on a field that is not a number";
          }
          if constexpr (!std::is_same_v<T, bool>) {
            EXPECT_EQ(f.traits & kNegatable, 0u) << f.flag << ": not a switch";
          }
        },
        f.member);
  });
  for (const char* object : {"optim", "trainer"}) EXPECT_EQ(paths.count(std::string("/") + object), 0u) << object;
}

// docs/errors.md's table of the flags that only some trainers have: flag -> FlagSet bits.
std::map<std::string, unsigned> documented_trainers() {
  std::ifstream in(PWM_ERRORS_MD);
  std::map<std::string, unsigned> out;
  std::string line;
  bool table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| flag | spmd_train | pathways_train | mpmd_train |", 0) == 0) table = true;
    else if (table && line.rfind("|", 0) != 0) break;
    if (!table || line.rfind("| flag", 0) == 0 || line.rfind("| ---", 0) == 0) continue;
    std::vector<std::string> cells;  // "| `--a`, `--b` | yes | | |" -> the four between the bars
    for (size_t a = 1, b; (b = line.find('|', a)) != std::string::npos; a = b + 1) cells.push_back(line.substr(a, b - a));
    EXPECT_EQ(cells.size(), 4u) << line;
    unsigned bits = 0;
    for (size_t i = 1; i < cells.size(); ++i)
      if (cells[i].find_first_not_of(' ') != std::string::npos) bits |= 1u << static_cast<int>(kSets[i - 1]);
    for (size_t a = cells[0].find('`'), b; a != std::string::npos && (b = cells[0].find('`', a + 1)) != std::string::npos;
         a = cells[0].find('`', b + 1))
      out[cells[0].substr(a + 1, b - a - 1)] = bits;  // each `--flag` of the row
  }
  EXPECT_FALSE(out.empty()) << PWM_ERRORS_MD << " has no table of flags per trainer";
  return out;
}

TEST(ConfigFields, EachFlagIsRegisteredByTheTrainersItsRowNames) {
  // The rows name the trainers docs/errors.md names (every trainer for a flag it does not list).
  std::map<std::string, unsigned> documented = documented_trainers();
  for_each_row([&](const auto& f, const char*) {
    if (f.flag == nullptr) return;
    const auto it = documented.find(f.flag);
    EXPECT_EQ(f.trainers, it != documented.end() ? it->second : trainers::kAll) << f.flag;
    if (it != documented.end()) documented.erase(it);
  });
  for (const auto& [flag, bits] : documented) ADD_FAILURE() << "docs/errors.md lists " << flag << ", which has no row";
  // Each trainer registers exactly those rows' flags and the model's.
  for (FlagSet set : kSets) {
    TrainConfig cfg;
    CLI::App app;
    add_train_flags(app, cfg, set);
    std::set<std::string> registered, expected = {"--help"};
    for (const CLI::Option* o : app.get_options()) registered.insert(o->get_name());
    for (const model::ConfigField& f : model::config_fields()) expected.insert(f.flag);
    for_each_row([&](const auto& f, const char*) {
      if (f.flag != nullptr && registers(f.trainers, set)) expected.insert(f.flag);
    });
    EXPECT_EQ(registered, expected) << trainer_name(set);
  }
  // A trainer without the flag refuses it naming the trainers whose row has it.
  for_each_row([&](const auto& f, const char*) {
    if (f.flag == nullptr) return;
    for (FlagSet set : kSets) {
      if (registers(f.trainers, set)) continue;
      TrainConfig cfg;
      std::string o;
      for (FlagSet s : kSets)
        if (s != set && registers(f.trainers, s)) o += fmt::format("{}{}'s", o.empty() ? "" : " and ", trainer_name(s));
      EXPECT_EQ(parse({std::string(f.flag) + "=1"}, set, cfg),
                fmt::format("{} is {}, not a flag of prog: leave it out (see prog --help)", f.flag, o));
    }
  });
}

// A value other than the field's default: as its flag's text, and as canonical_json holds it.
template <typename Part>
std::pair<std::string, nlohmann::json> other_value(const Field<Part>& f) {
  const Part defaults{};
  auto [text, value] = std::visit(
      [&](auto m) -> std::pair<std::string, nlohmann::json> {
        using T = std::remove_cvref_t<decltype(defaults.*m)>;
        const T d = defaults.*m;
        if constexpr (std::is_same_v<T, bool>) {
          return {d ? "false" : "true", !d};
        } else if constexpr (std::is_enum_v<T>) {
          for (const std::string& n : Mode<T>::names())
            if (n != Mode<T>::name(d)) return {n, n};
          return {"", nullptr};
        } else if constexpr (std::is_same_v<T, std::string>) {
          return {d + "x_" + f.key, d + "x_" + f.key};
        } else if constexpr (std::is_same_v<T, double>) {
          return {fmt::format("{}", d + 0.25), d + 0.25};
        } else {
          return {fmt::format("{}", d + 3), static_cast<T>(d + 3)};
        }
      },
      f.member);
  if (f.json == FieldJson::kTrainer) value = text;
  return {text, value};
}

TEST(ConfigFields, EachFlagsValueIsReadBackUnderItsRowsKey) {
  for (FlagSet set : kSets) {
    TrainConfig base;
    ASSERT_EQ(parse({}, set, base), "");
    const nlohmann::json before = nlohmann::json::parse(base.canonical_json(true)).flatten();
    std::set<std::string> derived;  // the rows without a flag: their values follow another's
    for_each_row([&](const auto& f, const char* object) {
      if (f.flag == nullptr) derived.insert(path_of(object, f.key));
    });
    for_each_row([&](const auto& f, const char* object) {
      if (f.flag == nullptr || !registers(f.trainers, set)) return;
      const auto [text, value] = other_value(f);
      TrainConfig cfg;
      ASSERT_EQ(parse({std::string(f.flag) + "=" + text}, set, cfg), "") << f.flag;
      const nlohmann::json after = nlohmann::json::parse(cfg.canonical_json(true)).flatten();
      const std::string path = path_of(object, f.key);
      ASSERT_TRUE(after.contains(path)) << f.flag << " " << path;
      EXPECT_EQ(after.at(path), value) << f.flag << "=" << text << " read back as " << after.at(path).dump();
      for (const auto& [k, v] : after.items())  // nothing else changed but the values that follow it
        if (k != path && !derived.count(k)) {
          EXPECT_EQ(before.contains(k) ? before.at(k) : nullptr, v) << f.flag << ": " << k;
        }
    });
  }
  // The rows without a flag: the optimizer's schedule is --steps long; canonical_json's
  // global_batch is --batch.
  TrainConfig cfg;
  ASSERT_EQ(parse({"--steps=7", "--batch=32"}, FlagSet::kSpmd, cfg), "");
  const nlohmann::json j = nlohmann::json::parse(cfg.canonical_json());
  EXPECT_EQ(j["optim"]["total_steps"], 7);
  EXPECT_EQ(j["global_batch"], 32);
  EXPECT_EQ(j["batch"], 32);
  EXPECT_EQ(nlohmann::json::parse(cfg.workload_json())["optim"]["total_steps"], 7);
}

// Values outside a row's range: below its lower bound, above its upper one, non-finite.
std::vector<double> outside(const FieldRange& r) {
  std::vector<double> v;
  if (std::isfinite(r.lo)) v.push_back(r.open_lo ? r.lo : r.lo - 1);
  if (std::isfinite(r.hi)) v.push_back(r.open_hi ? r.hi : r.hi + 1);
  v.push_back(std::numeric_limits<double>::quiet_NaN());
  return v;
}

// Sets the row's member in `c` to `v`; false if the member cannot hold it (a count and a NaN).
template <typename Part>
bool set_number(TrainConfig& c, const Field<Part>& f, double v) {
  Part& part = part_of<Part>(c);
  return std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(part.*m)>;
        if constexpr (std::is_same_v<T, double>) {
          part.*m = v;
          return true;
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if (!std::isfinite(v)) return false;
          part.*m = static_cast<T>(v);
          return true;
        }
        return false;
      },
      f.member);
}

TEST(ConfigFields, EachRangesErrorLineNamesItsFlag) {
  EXPECT_EQ(error_of([] { TrainConfig{}.validate(1); }), "(no error)");
  int checked = 0;
  for_each_row([&](const auto& f, const char*) {
    if (!f.range.bounded) return;
    for (double bad : outside(f.range)) {
      TrainConfig c;
      if (!set_number(c, f, bad)) continue;
      const std::string e = error_of([&] { c.validate(1); });
      EXPECT_EQ(e.rfind(std::string(f.flag) + " must ", 0), 0u) << f.flag << "=" << bad << ": " << e;
      EXPECT_NE(e.find(fmt::format("(got {})", bad)), std::string::npos) << f.flag << ": " << e;
      ++checked;
    }
  });
  EXPECT_GE(checked, 14);  // every bounded row at least once
}

}  // namespace
}  // namespace pwm::train
