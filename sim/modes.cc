#include <string>
#include <utility>

#include "common/check.h"
#include "sim/sim.h"

namespace pwm::sim {

namespace {
constexpr std::pair<ExecMode, const char*> kModes[] = {
    {ExecMode::kSpmd, "spmd"}, {ExecMode::kFused, "fused"}, {ExecMode::kChained, "chained"}, {ExecMode::kOpByOp, "opbyop"}};
constexpr std::pair<MpmdModel, const char*> kMpmd[] = {{MpmdModel::kPathways, "pathways"}, {MpmdModel::kStatic, "static"}};

// Parsing and naming both read one table per enum, so the two cannot drift apart.
template <typename E, size_t N>
E parse(const std::pair<E, const char*> (&table)[N], std::string_view text, const char* what) {
  for (const auto& [m, t] : table)
    if (text == t) return m;
  std::string accepted;
  for (const auto& [m, t] : table) accepted += (accepted.empty() ? "" : ", ") + std::string(t);
  PWM_THROW("unknown {} '{}' ({})", what, text, accepted);
}

template <typename E, size_t N>
const char* text_of(const std::pair<E, const char*> (&table)[N], E value, const char* what) {
  for (const auto& [v, t] : table)
    if (v == value) return t;
  PWM_THROW("unknown {} {}", what, static_cast<int>(value));
}

}  // namespace

ExecMode parse_exec_mode(std::string_view text) { return parse(kModes, text, "granularity"); }
const char* name(ExecMode m) { return text_of(kModes, m, "execution mode"); }
MpmdModel parse_mpmd_model(std::string_view text) { return parse(kMpmd, text, "--mpmd"); }
const char* name(MpmdModel m) { return text_of(kMpmd, m, "MPMD model"); }

}  // namespace pwm::sim
