#include "train/modes.h"

#include <array>
#include <utility>

#include "common/check.h"

namespace pwm::train {

namespace {

// One table per enum: the value and its flag text. Parsing and naming both read it, so the two
// cannot drift apart.
template <typename E, size_t N>
using Table = std::array<std::pair<E, const char*>, N>;

constexpr Table<Granularity, 3> kGranularities{{{Granularity::kFused, "fused"},
                                                 {Granularity::kChained, "chained"},
                                                 {Granularity::kOpByOp, "opbyop"}}};
constexpr Table<Schedule, 2> kSchedules{{{Schedule::kGpipe, "gpipe"}, {Schedule::k1F1B, "1f1b"}}};
constexpr Table<ReplicaReduce, 2> kReplicaReduces{{{ReplicaReduce::kHierarchical, "hierarchical"},
                                                    {ReplicaReduce::kFlat, "flat"}}};
constexpr Table<MoeRouting, 4> kMoeRoutings{{{MoeRouting::kAuto, "auto"},
                                             {MoeRouting::kStatic, "static"},
                                             {MoeRouting::kController, "controller"},
                                             {MoeRouting::kWorker, "worker"}}};

template <typename E, size_t N>
E parse(const Table<E, N>& table, std::string_view text, const char* flag) {
  for (const auto& [value, t] : table)
    if (text == t) return value;
  std::string accepted;
  for (const auto& [value, t] : table) accepted += (accepted.empty() ? "" : ", ") + std::string(t);
  PWM_THROW("{} must be one of {} (got '{}')", flag, accepted, text);
}

template <typename E, size_t N>
const char* text_of(const Table<E, N>& table, E value) {
  for (const auto& [v, t] : table)
    if (v == value) return t;
  PWM_THROW("unknown mode value {}", static_cast<int>(value));
}

template <typename E, size_t N>
std::vector<std::string> names_of(const Table<E, N>& table) {
  std::vector<std::string> out;
  for (const auto& [v, t] : table) out.emplace_back(t);
  return out;
}

}  // namespace

Granularity parse_granularity(std::string_view text) { return parse(kGranularities, text, "--granularity"); }
Schedule parse_schedule(std::string_view text) { return parse(kSchedules, text, "--schedule"); }
ReplicaReduce parse_replica_reduce(std::string_view text) { return parse(kReplicaReduces, text, "--replica-reduce"); }
MoeRouting parse_moe_routing(std::string_view text) { return parse(kMoeRoutings, text, "--moe-routing"); }

const char* name(Granularity g) { return text_of(kGranularities, g); }
const char* name(Schedule s) { return text_of(kSchedules, s); }
const char* name(ReplicaReduce r) { return text_of(kReplicaReduces, r); }
const char* name(MoeRouting r) { return text_of(kMoeRoutings, r); }

std::vector<std::string> granularity_names() { return names_of(kGranularities); }
std::vector<std::string> schedule_names() { return names_of(kSchedules); }
std::vector<std::string> replica_reduce_names() { return names_of(kReplicaReduces); }
std::vector<std::string> moe_routing_names() { return names_of(kMoeRoutings); }

}  // namespace pwm::train
