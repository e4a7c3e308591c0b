#include "common/check.h"
#include "sim/sim.h"

namespace pwm::sim {

namespace {
constexpr std::pair<ExecMode, const char*> kModes[] = {
    {ExecMode::kSpmd, "spmd"}, {ExecMode::kFused, "fused"}, {ExecMode::kChained, "chained"}, {ExecMode::kOpByOp, "opbyop"}};
constexpr std::pair<MpmdModel, const char*> kMpmd[] = {{MpmdModel::kPathways, "pathways"}, {MpmdModel::kStatic, "static"}};
}  // namespace

ExecMode parse_exec_mode(std::string_view text) {
  for (const auto& [m, t] : kModes)
    if (text == t) return m;
  PWM_THROW("unknown granularity '{}' (spmd, fused, chained, opbyop)", text);
}

const char* name(ExecMode m) {
  for (const auto& [v, t] : kModes)
    if (v == m) return t;
  PWM_THROW("unknown execution mode {}", static_cast<int>(m));
}

MpmdModel parse_mpmd_model(std::string_view text) {
  for (const auto& [m, t] : kMpmd)
    if (text == t) return m;
  PWM_THROW("unknown --mpmd '{}' (pathways, static)", text);
}

const char* name(MpmdModel m) {
  for (const auto& [v, t] : kMpmd)
    if (v == m) return t;
  PWM_THROW("unknown MPMD model {}", static_cast<int>(m));
}

}  // namespace pwm::sim
