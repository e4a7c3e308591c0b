#include "mpmd/static_backend.h"

#include <fmt/format.h>

#include <algorithm>

#include "collectives/strings.h"
#include "common/check.h"
#include "common/stats.h"
#include "mpmd/startup.h"
#include "programs/pipeline.h"

namespace pwm::mpmd {

using train::Granularity;

namespace {

// --quota: each stage's registers (activations held from its forward to its backward) must hold
// what the schedule's order keeps, or the stage could never run its next forward: refused here,
// naming the stage, its need and the quota, instead of a run that waits forever.
void validate_quota(const train::TrainConfig& cfg) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.quota < 0) PWM_THROW("--quota must be >= 0 (got {}; 0: what the schedule needs)", p.quota);
  if (p.quota == 0) return;
  if (p.stages == 1) PWM_THROW("--quota {} applies to pipelines: add --stages 2 or more, or leave it out", p.quota);
  const std::vector<int> need = programs::stage_activations(p.schedule, p.stages, cfg.workload.microbatches);
  for (int s = 0; s < p.stages; ++s)
    if (p.quota < need[static_cast<size_t>(s)])
      PWM_THROW("--quota {} is below what --schedule {} needs on stage {}: {} micro-batches' activations held from its "
                "forward to its backward (the stage's edge into its own backward); use --quota {} or more{}",
                p.quota, train::name(p.schedule), s, need[static_cast<size_t>(s)],
                *std::max_element(need.begin(), need.end()),
                p.schedule == train::Schedule::kGpipe ? ", or --schedule 1f1b (S - s on stage s)" : "");
}

// What needs a controller refused before anything starts, one line each (the flags that only a
// controller has, --islands, --sequential, --expert-island and --spare-workers, are not mpmd_train's:
// train/flags.h refuses them).
void validate(const train::TrainConfig& cfg, int world) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.stages < 1) PWM_THROW("--stages must be at least 1 (got {})", p.stages);
  if (cfg.mesh.replicas > 1 && cfg.model.moe())
    PWM_THROW("mpmd_train runs Mixture-of-Experts models on one slice, as pathways_train: leave out --replicas "
              "(spmd_train runs MoE with --replicas)");
  if (p.stages > 1 && (cfg.mesh.fsdp || cfg.model.moe()))
    PWM_THROW("mpmd_train runs --stages without --fsdp and without MoE, as pathways_train; use spmd_train for those");
  validate_quota(cfg);
  // (Slice i's contexts, 1 + 5 i .. 5 + 5 i, stay below the 900 left to code around it.)
  constexpr int kMaxSlices = 899 / static_cast<int>(dataflow::kSliceContextStride);
  if (cfg.mesh.replicas * p.stages > kMaxSlices)
    PWM_THROW("mpmd_train runs at most {} slices (--replicas x --stages; got {}): each takes {} of the collectives' "
              "contexts", kMaxSlices, cfg.mesh.replicas * p.stages, dataflow::kSliceContextStride);
  if (p.granularity == Granularity::kOpByOp)
    PWM_THROW("mpmd_train has no --granularity opbyop: with no controller there is no client to call node by node "
              "(use fused or chained)");
  if (p.moe_routing == train::MoeRouting::kController)
    PWM_THROW("mpmd_train has no controller to route through: use --moe-routing worker (dropless) or static");
  check_stages(cfg, world, 0);
  // replicas x dp x tp = every rank, or R x S slices of dp x tp
  cfg.validate(p.stages == 1 ? world : cfg.mesh.replicas * cfg.mesh.dp * cfg.mesh.tp);
}

}  // namespace

train::TrainerSpec static_spec() {
  train::TrainerSpec s;
  s.program = "mpmd_train";
  s.description =
      "Static MPMD trainer: every rank runs its own part of the training step's program in a fixed order, with no "
      "controller.";
  s.flags = train::FlagSet::kStatic;
  s.validate = validate;
  return s;
}

StaticBackend::StaticBackend(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport)
    : rank_(transport->rank()), rt_(transport, cfg.exec.coll_timeout) {}

void StaticBackend::report(train::TrainReport& r, const std::vector<int>& slices, const dataflow::Executable* step) {
  // The static order's cost: point-to-point messages a rank sends per step, and the time it
  // waited for its receives before its kernels (median step, the slowest rank); per slice (a
  // pipeline: per stage), its ranks' most bytes of a step's intermediates alive at once.
  PWM_CHECK(step != nullptr, "the static model's step is one program");
  const static_mpmd::ExecutableStats& st = static_mpmd::StaticRuntime::stats(*step);
  const double steps = static_cast<double>(std::max<uint64_t>(1, st.runs));
  double mine[3] = {static_cast<double>(st.messages) / steps, st.recv_wait_ms.empty() ? 0.0 : median(st.recv_wait_ms),
                    static_cast<double>(st.peak_intermediate_bytes)};
  const int world = rt_.world().size();
  std::vector<double> w(3 * static_cast<size_t>(world));
  rt_.world().allgather(mine, w.data(), 3, collectives::DataType::kFloat64);
  double msgs = 0, wait = 0;
  std::vector<double> inter;
  for (int sl : slices) {
    double most = 0;
    for (int d : rt_.devices(sl)) most = std::max(most, w[3 * static_cast<size_t>(d) + 2]);
    inter.push_back(most);
  }
  for (int k = 0; k < world; ++k) {
    msgs = std::max(msgs, w[3 * static_cast<size_t>(k)]);
    wait = std::max(wait, w[3 * static_cast<size_t>(k) + 1]);
  }
  r.figures().messages_per_step = msgs;
  r.figures().recv_wait_ms = wait;
  r.figures().peak_intermediate_bytes = inter;
}

std::vector<std::string> StaticBackend::trace_fragments(const std::vector<dataflow::Array>& per_slice, int64_t) {
  // This rank's own fragment (its slice's array holds its shard), then every rank's, in rank
  // order: slice by slice, device by device.
  std::string mine;
  for (const dataflow::Array& a : per_slice)
    if (const dataflow::ObjectPtr b = static_mpmd::StaticRuntime::shard(a)) {
      const auto* w = static_cast<const int64_t*>(b->buf.data());
      mine.assign(reinterpret_cast<const char*>(w + 1), static_cast<size_t>(w[0]));
    }
  return collectives::allgather_strings(rt_.world(), mine);
}

}  // namespace pwm::mpmd
