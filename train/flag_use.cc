#include "train/flag_use.h"

#include <algorithm>

#include "common/check.h"

namespace pwm::train {

namespace {
bool moe(const TrainConfig& c) { return c.model.moe(); }
bool pipeline(const TrainConfig& c) { return c.mpmd.stages > 1; }
// --granularity shapes one slice's step (or a replica's); a pipeline's stages are programs of
// their own whatever it says (mpmd/trainer.cc step_program).
bool not_pipeline(const TrainConfig& c) { return c.mpmd.stages <= 1; }
bool replicas(const TrainConfig& c) { return c.mesh.replicas > 1; }
// The gradient's sum over data-parallel ranks: with one rank there is nothing to bucket or to
// overlap (spmd/trainer.cc make_reducers, programs/step_kernels.cc and pipeline.cc).
bool summed(const TrainConfig& c) { return c.data_parallel() > 1; }
bool kill(const TrainConfig& c) { return c.hooks.kill_step >= 0; }
bool straggler(const TrainConfig& c) { return c.hooks.straggler_ms > 0; }
}  // namespace

const std::vector<FlagUse>& flag_uses() {
  static const std::vector<FlagUse> rows = {
      {{"--top-k", "--moe-every", "--capacity-factor", "--aux-loss", "--router-z-loss", "--router-skew",
        "--expert-parallel", "--moe-routing", "--expert-island"},
       "Mixture-of-Experts models", "add --experts E", moe, {"--experts", "4"}},
      {{"--schedule", "--quota"}, "pipelines", "add --stages 2 or more", pipeline, {"--stages", "2"}},
      {{"--granularity"}, "one slice's step, not a pipeline's stages (each is a program of its own)",
       "drop --stages", not_pipeline, {"--stages", "1"}, {"--stages", "2"}},
      {{"--replica-reduce"}, "runs of several replicas", "add --replicas 2 or more", replicas, {"--replicas", "2"}},
      {{"--bucket-bytes", "--overlap", "--no-overlap"}, "gradients summed over data-parallel ranks",
       "add --dp 2 or more (or --replicas)", summed, {"--dp", "2"}},
      {{"--kill-rank", "--kill-signal"}, "a kill test", "add --kill-step N", kill, {"--kill-step", "0"}},
      {{"--straggler-rank"}, "a straggler test", "add --straggler-ms MS (more than 0)", straggler,
       {"--straggler-ms", "5"}},
  };
  return rows;
}

void refuse_unused_flags(const TrainConfig& cfg) {
  for (const std::string& given : cfg.given_flags)
    for (const FlagUse& row : flag_uses()) {
      if (std::find(row.flags.begin(), row.flags.end(), given) == row.flags.end() || row.used(cfg)) continue;
      PWM_THROW("{} applies to {}: {}, or leave {} out", given, row.applies_to, row.fix, given);
    }
}

}  // namespace pwm::train
