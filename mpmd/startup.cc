#include "mpmd/startup.h"

#include <fmt/format.h>
#include <malloc.h>

#include "common/check.h"

namespace pwm::mpmd {

void keep_large_blocks_in_heap() {
  // Large blocks stay in the heap, where freed memory is reused, instead of mmap/munmap per
  // block. Added for speed (every node's outputs were fresh pages: chained steps 1002 -> 710 ms).
  // A step's buffers of 1 MiB or more now come from the runtime's buffer pool (dataflow/buffer.h);
  // what is left to malloc is the kernels' temporaries (Eigen's, the collectives' scratch). With
  // the pool, without these two calls, compare.sh's default rows have the same peak RSS (within
  // 2 MiB) and the same step time, except the pipeline's step: 1.034x slower (median of 7 paired
  // ratios, 1.012-1.064; 2026-12-07, docs/results/memory.md; why was not taken apart). So they
  // stay, for speed: they inflate no peak measured here. (MPI's buffer rules do not rest on them:
  // a send left posted keeps its buffer, Transport::abandon.)
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

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
