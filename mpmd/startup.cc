#include "mpmd/startup.h"

#include <fmt/format.h>

#include "common/check.h"

namespace pwm::mpmd {

std::optional<int> start(int argc, char** argv, collectives::MpiEnvironment& env, const train::TrainerSpec& spec,
                         train::Startup& s, bool& resume) {
  if (const auto code = train::bootstrap(argc, argv, env, spec, s)) return code;
  resume = s.resume_from.has_value();
  s.resume_from.reset();
  return std::nullopt;
}

void check_stages(const train::TrainConfig& cfg, int devices, int launch_extra) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.stages < 1) PWM_THROW("--stages must be at least 1 (got {})", p.stages);
  if (p.stages == 1) return;
  if (p.stages > cfg.model.n_layers)
    PWM_THROW("--stages {} is more than --layers {}: each stage needs a layer", p.stages, cfg.model.n_layers);
  // Every replica is a pipeline of S stages, each a --dp x --tp slice.
  const int per_stage = cfg.mesh.dp * cfg.mesh.tp, need = cfg.mesh.replicas * p.stages * per_stage;
  if (devices != need)
    PWM_THROW("--stages {} needs {} {} ({}{} stages of --dp {} x --tp {} devices), but the job has {} (mpirun -n {})",
              p.stages, need, launch_extra ? "workers" : "ranks",
              cfg.mesh.replicas > 1 ? fmt::format("--replicas {} x ", cfg.mesh.replicas) : "", p.stages, cfg.mesh.dp,
              cfg.mesh.tp, devices, need + launch_extra);
}

}  // namespace pwm::mpmd
