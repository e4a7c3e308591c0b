// TrainConfig's parts other than the model (optimizer, mesh, execution, workload, outputs, testing
// hooks, the MPMD trainers' settings): their fields declared once, one table per part, as
// model/config_fields.h declares the model's. From these tables come the flags, their --help and
// the trainers that register each (train/flags.cc), the simple ranges TrainConfig::validate checks
// under the flag's name, and workload_json, to_json and canonical_json (train/config.cc). A new
// field is one row. Checks across fields (divisibility, the mesh's product, a flag that needs
// another) stay code in TrainConfig::validate.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/kernels.h"
#include "model/optim.h"
#include "train/config.h"
#include "train/flags.h"
#include "train/modes.h"

namespace pwm::train {

// --help's groups, in the order --help prints them (after the model's).
enum class FieldGroup { kOptimizer, kWorkload, kOutputs, kExecution, kTesting, kPathways };
constexpr FieldGroup kFieldGroups[] = {FieldGroup::kOptimizer, FieldGroup::kWorkload, FieldGroup::kOutputs,
                                       FieldGroup::kExecution, FieldGroup::kTesting,  FieldGroup::kPathways};
const char* group_name(FieldGroup g);  // "Workload"

// Which trainers register a field's flag (FlagSet's bits; mpmd_train is kStatic).
namespace trainers {
constexpr unsigned kSpmd = 1u << static_cast<int>(FlagSet::kSpmd);
constexpr unsigned kPathways = 1u << static_cast<int>(FlagSet::kPathways);
constexpr unsigned kStatic = 1u << static_cast<int>(FlagSet::kStatic);
constexpr unsigned kMpmd = kPathways | kStatic;
constexpr unsigned kAll = kSpmd | kMpmd;
}  // namespace trainers
constexpr bool registers(unsigned trainers, FlagSet set) { return (trainers >> static_cast<int>(set)) & 1u; }

// Which of TrainConfig's JSON texts holds a field. Each text holds the fields of the ones before
// it: workload_json within to_json within canonical_json.
enum class FieldJson {
  kWorkload,   // the workload's identity (workload_json; a checkpoint stores it)
  kRun,        // to_json (the metrics header)
  kCanonical,  // canonical_json only
  kTrainer,    // canonical_json(mpmd = true) only, under "trainer", as the flag's text
};

// A flag's accepted range, checked by TrainConfig::validate under the flag's name. A real is also
// required finite, an infinite bound is none, `open_lo` / `open_hi` exclude the bound itself
// ("--beta1 must be in [0, 1) (got 1)"). An integer has a lower bound only ("--steps must be at
// least 1 (got 0)"; a bound of 0: "--skip-nonfinite must be >= 0 (got -1)").
struct FieldRange {
  bool bounded = false;
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool open_lo = false, open_hi = false;
};
constexpr FieldRange at_least(double lo) { return {true, lo}; }
constexpr FieldRange in_range(double lo, double hi, bool open_lo = false, bool open_hi = false) {
  return {true, lo, hi, open_lo, open_hi};
}

// Row traits.
constexpr unsigned kNegatable = 1;    // a switch that also has --no-X (--fsdp, --no-fsdp)
constexpr unsigned kOmitDefault = 2;  // left out of the JSON texts at its default (expert_parallel)

template <typename Part>
struct Field {
  using Member = std::variant<bool Part::*, int Part::*, int64_t Part::*, uint64_t Part::*, double Part::*,
                              std::string Part::*, Granularity Part::*, Schedule Part::*, ReplicaReduce Part::*,
                              MoeRouting Part::*, model::Precision Part::*, TestHooks::KillSignal Part::*>;
  const char* key;   // the JSON key (in the part's object, FieldTables::object)
  const char* flag;  // "--lr"; nullptr: no flag (a value set from another field's)
  const char* help;
  FieldGroup group;
  Member member;
  FieldJson json;
  FieldRange range = {};
  unsigned trainers = trainers::kAll;
  unsigned traits = 0;
};
static_assert(std::is_same_v<size_t, uint64_t>, "ExecConfig::bucket_bytes is a uint64_t member");

// The tables, one per part.
const std::vector<Field<model::AdamWConfig>>& optim_fields();
const std::vector<Field<MeshConfig>>& mesh_fields();
const std::vector<Field<ExecConfig>>& exec_fields();
const std::vector<Field<WorkloadConfig>>& workload_fields();
const std::vector<Field<OutputConfig>>& output_fields();
const std::vector<Field<TestHooks>>& hook_fields();
const std::vector<Field<MpmdConfig>>& mpmd_fields();

// Calls fn(part, rows, object) for each part of `c` (a TrainConfig, const or not) with its table,
// in the order the flags are registered within a --help group; `object` is the JSON object that
// holds the part's fields ("optim", "trainer"), nullptr for the top level.
template <typename Config, typename Fn>
void for_each_part(Config& c, Fn&& fn) {
  fn(c.optim, optim_fields(), "optim");
  fn(c.mesh, mesh_fields(), nullptr);
  fn(c.exec, exec_fields(), nullptr);  // before the workload: --replica-reduce is in its group
  fn(c.workload, workload_fields(), nullptr);
  fn(c.outputs, output_fields(), nullptr);
  fn(c.hooks, hook_fields(), nullptr);
  fn(c.mpmd, mpmd_fields(), "trainer");
}

// An enum field's texts (train/modes.h): the accepted ones in order (CLI11's check, --help),
// parsing one, and a value's.
template <typename E>
struct Mode;
template <>
struct Mode<Granularity> {
  static std::vector<std::string> names() { return granularity_names(); }
  static Granularity parse(const std::string& s) { return parse_granularity(s); }
  static const char* name(Granularity v) { return train::name(v); }
};
template <>
struct Mode<Schedule> {
  static std::vector<std::string> names() { return schedule_names(); }
  static Schedule parse(const std::string& s) { return parse_schedule(s); }
  static const char* name(Schedule v) { return train::name(v); }
};
template <>
struct Mode<ReplicaReduce> {
  static std::vector<std::string> names() { return replica_reduce_names(); }
  static ReplicaReduce parse(const std::string& s) { return parse_replica_reduce(s); }
  static const char* name(ReplicaReduce v) { return train::name(v); }
};
template <>
struct Mode<MoeRouting> {
  static std::vector<std::string> names() { return moe_routing_names(); }
  static MoeRouting parse(const std::string& s) { return parse_moe_routing(s); }
  static const char* name(MoeRouting v) { return train::name(v); }
};
template <>
struct Mode<model::Precision> {
  static std::vector<std::string> names() { return {"fp32", "bf16"}; }
  static model::Precision parse(const std::string& s) { return model::parse_precision(s); }
  static const char* name(model::Precision v) { return model::precision_name(v); }
};
template <>
struct Mode<TestHooks::KillSignal> {
  static std::vector<std::string> names() { return {"kill", "stop"}; }
  static TestHooks::KillSignal parse(const std::string& s) {
    return s == "stop" ? TestHooks::KillSignal::kStop : TestHooks::KillSignal::kKill;
  }
  static const char* name(TestHooks::KillSignal v) { return v == TestHooks::KillSignal::kStop ? "stop" : "kill"; }
};

// A field's value in the JSON texts (an enum by its name) and as its flag's text ("true",
// "1f1b", "2"); whether it is the part's default.
template <typename Part>
nlohmann::json field_json(const Part& p, const Field<Part>& f);
template <typename Part>
std::string field_text(const Part& p, const Field<Part>& f);
template <typename Part>
bool at_default(const Part& p, const Field<Part>& f);

}  // namespace pwm::train
