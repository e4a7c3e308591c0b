#include "train/config_fields.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pwm::train {

namespace {
using G = FieldGroup;
using J = FieldJson;
constexpr double inf = std::numeric_limits<double>::infinity();
}  // namespace

const char* group_name(FieldGroup g) {
  switch (g) {
    case G::kOptimizer: return "Optimizer (AdamW, warm-up + cosine)";
    case G::kWorkload: return "Workload";
    case G::kOutputs: return "Outputs";
    case G::kExecution: return "Execution";
    case G::kTesting: return "Testing";
    case G::kPathways: return "Pathways";
  }
  return "?";
}

const std::vector<Field<model::AdamWConfig>>& optim_fields() {
  using A = model::AdamWConfig;
  static const std::vector<Field<A>> fields = {
      {"lr", "--lr", "peak learning rate", G::kOptimizer, &A::lr, J::kWorkload, in_range(0, inf)},
      {"beta1", "--beta1", "", G::kOptimizer, &A::beta1, J::kWorkload, in_range(0, 1, false, true)},
      {"beta2", "--beta2", "", G::kOptimizer, &A::beta2, J::kWorkload, in_range(0, 1, false, true)},
      {"eps", "--eps", "", G::kOptimizer, &A::eps, J::kWorkload, in_range(0, inf, true)},
      {"weight_decay", "--weight-decay", "decoupled decay (matrices, embedding)", G::kOptimizer, &A::weight_decay,
       J::kWorkload, in_range(0, inf)},
      // Any finite value (<= 0 turns clipping off): the range is finiteness only.
      {"max_grad_norm", "--max-grad-norm", "global-norm clipping (<= 0: off)", G::kOptimizer, &A::max_grad_norm,
       J::kWorkload, in_range(-inf, inf)},
      {"warmup_steps", "--warmup-steps", "", G::kOptimizer, &A::warmup_steps, J::kWorkload, at_least(0)},
      // --steps, copied by parse_train_config (the cosine schedule's length).
      {"total_steps", nullptr, "", G::kOptimizer, &A::total_steps, J::kWorkload, {}, 0},
      {"min_lr_frac", "--min-lr-frac", "cosine floor as a fraction of --lr", G::kOptimizer, &A::min_lr_frac,
       J::kWorkload, in_range(0, 1)},
  };
  return fields;
}

const std::vector<Field<MeshConfig>>& mesh_fields() {
  using M = MeshConfig;
  static const std::vector<Field<M>> fields = {
      {"replicas", "--replicas", "model replicas, one per island (data parallel across islands)", G::kWorkload,
       &M::replicas, J::kRun},
      {"dp", "--dp", "data-parallel ranks inside a replica", G::kWorkload, &M::dp, J::kRun},
      {"tp", "--tp", "tensor-parallel ranks (adjacent world ranks)", G::kWorkload, &M::tp, J::kRun},
      // Written only under expert parallelism (the metrics headers of runs without it have no key).
      {"expert_parallel", "--expert-parallel",
       "split each MoE layer's experts over this many consecutive --dp ranks (AllToAll dispatch)", G::kWorkload, &M::ep,
       J::kRun, at_least(1), trainers::kAll, kOmitDefault},
      {"fsdp", "--fsdp", "shard parameters, gradients and AdamW moments over --dp (ZeRO-3)", G::kWorkload, &M::fsdp,
       J::kRun, {}, trainers::kAll, kNegatable},
  };
  return fields;
}

const std::vector<Field<ExecConfig>>& exec_fields() {
  using E = ExecConfig;
  static const std::vector<Field<E>> fields = {
      {"bucket_bytes", "--bucket-bytes", "gradient AllReduce bucket (fusion buffer) size in bytes (0: sized from the model)",
       G::kExecution, &E::bucket_bytes, J::kRun},
      {"overlap", "--overlap", "overlap bucket AllReduces with backward", G::kExecution, &E::overlap, J::kRun, {},
       trainers::kAll, kNegatable},
      {"replica_reduce", "--replica-reduce",
       "spmd_train with --replicas > 1: hierarchical (reduce-scatter, cross-replica allreduce, allgather) or flat",
       G::kWorkload, &E::replica_reduce, J::kRun, {}, trainers::kSpmd},
      {"coll_timeout", "--coll-timeout",
       "collectives watchdog and liveness timeout, seconds (default: PWM_COLL_TIMEOUT, else 300)", G::kExecution,
       &E::coll_timeout, J::kCanonical, in_range(0, 1e9, true)},
      {"peak_gflops", "--peak-gflops", "per-rank GEMM peak for MFU (0: measure)", G::kExecution, &E::peak_gflops,
       J::kCanonical, in_range(0, inf)},
      {"precision", "--precision", "matrix products: fp32, or bf16 with fp32 sums (oneDNN)", G::kExecution,
       &E::precision, J::kRun},
  };
  return fields;
}

const std::vector<Field<WorkloadConfig>>& workload_fields() {
  using W = WorkloadConfig;
  static const std::vector<Field<W>> fields = {
      {"batch", "--batch", "global batch in sequences per optimizer step", G::kWorkload, &W::global_batch,
       J::kWorkload},
      // The same value under canonical_json's older name.
      {"global_batch", nullptr, "", G::kWorkload, &W::global_batch, J::kCanonical, {}, 0},
      {"microbatches", "--microbatches", "gradient-accumulation micro-batches per dp rank", G::kWorkload,
       &W::microbatches, J::kRun},
      {"steps", "--steps", "optimizer steps (also the cosine schedule's length)", G::kWorkload, &W::steps, J::kRun,
       at_least(1)},
      {"data_seed", "--data-seed", "seed of the batch sampler", G::kWorkload, &W::data_seed, J::kWorkload},
      {"data", "--data", "text file or directory (default: /usr/share/common-licenses)", G::kWorkload, &W::data,
       J::kWorkload},
      {"val_fraction", "--val-fraction", "share of the data held out for validation", G::kWorkload, &W::val_fraction,
       J::kWorkload, in_range(0, 1, true, true)},
      {"eval_every", "--eval-every", "validation loss every N steps (0: at the end only)", G::kWorkload, &W::eval_every,
       J::kRun},
      {"eval_batches", "--eval-batches", "validation batches per evaluation", G::kWorkload, &W::eval_batches, J::kRun},
      {"skip_nonfinite", "--skip-nonfinite",
       "skip up to N steps whose loss or gradient norm is non-finite (no update); the next ends the run", G::kWorkload,
       &W::skip_nonfinite, J::kRun, at_least(0)},
  };
  return fields;
}

const std::vector<Field<OutputConfig>>& output_fields() {
  using O = OutputConfig;
  static const std::vector<Field<O>> fields = {
      {"log_every", "--log-every", "progress line every N steps (rank 0)", G::kOutputs, &O::log_every, J::kCanonical},
      {"metrics", "--metrics", "JSON-lines metrics file", G::kOutputs, &O::metrics, J::kCanonical},
      {"trace", "--trace", "Chrome/Perfetto trace file merged from all ranks", G::kOutputs, &O::trace, J::kCanonical},
      {"ckpt", "--ckpt", "checkpoint file (written every --ckpt-every steps and at the end)", G::kOutputs, &O::ckpt,
       J::kCanonical},
      {"ckpt_every", "--ckpt-every", "checkpoint every N steps (0: at the end only)", G::kOutputs, &O::ckpt_every,
       J::kCanonical},
      {"resume", "--resume", "resume from --ckpt when it exists", G::kOutputs, &O::resume, J::kCanonical},
  };
  return fields;
}

const std::vector<Field<TestHooks>>& hook_fields() {
  using T = TestHooks;
  static const std::vector<Field<T>> fields = {
      {"kill_step", "--kill-step", "--kill-signal --kill-rank in the middle of this step", G::kTesting, &T::kill_step,
       J::kCanonical},
      {"kill_rank", "--kill-rank", "", G::kTesting, &T::kill_rank, J::kCanonical},
      {"kill_signal", "--kill-signal", "what --kill-step does to --kill-rank: kill (SIGKILL) or stop (SIGSTOP)",
       G::kTesting, &T::kill_signal, J::kCanonical},
      {"step_sleep_ms", "--step-sleep-ms", "sleep after every step (kill tests)", G::kTesting, &T::step_sleep_ms,
       J::kCanonical, at_least(0)},
      {"nan_step", "--nan-step", "make this step's loss and gradient norm NaN (non-finite tests)", G::kTesting,
       &T::nan_step, J::kCanonical},
      {"straggler_ms", "--straggler-ms", "--straggler-rank spends this much more in every step, ms", G::kTesting,
       &T::straggler_ms, J::kCanonical, at_least(0)},
      {"straggler_rank", "--straggler-rank", "the world rank --straggler-ms slows", G::kTesting, &T::straggler_rank,
       J::kCanonical},
  };
  return fields;
}

// Their ranges are the trainers' (mpmd/): checked with what needs the job's size.
const std::vector<Field<MpmdConfig>>& mpmd_fields() {
  using P = MpmdConfig;
  using namespace trainers;
  static const std::vector<Field<P>> fields = {
      {"granularity", "--granularity", "fused | chained | opbyop", G::kPathways, &P::granularity, J::kTrainer, {},
       kMpmd},
      {"stages", "--stages", "pipeline stages (> 1: MPMD pipeline, each stage a --dp x --tp slice)", G::kPathways,
       &P::stages, J::kTrainer, {}, kMpmd},
      {"schedule", "--schedule", "pipeline schedule: gpipe | 1f1b", G::kPathways, &P::schedule, J::kTrainer, {}, kMpmd},
      {"moe_routing", "--moe-routing",
       "MoE expert calls: static (capacity) | controller (dropless, a round trip per MoE layer) | worker "
       "(dropless, counts among the workers) | auto",
       G::kPathways, &P::moe_routing, J::kTrainer, {}, kMpmd},
      {"quota", "--quota",
       "pipeline: activations a stage may hold (its registers; 0: what --schedule needs); a quota below "
       "the schedule's need is refused before training",
       G::kPathways, &P::quota, J::kTrainer, {}, kStatic},
      {"islands", "--islands", "islands: KxM (K islands of M devices); default: one per host", G::kPathways,
       &P::islands, J::kTrainer, {}, kPathways},
      {"sequential", "--sequential", "sequential dispatch (the paper's baseline)", G::kPathways, &P::sequential,
       J::kTrainer, {}, kPathways},
      {"expert_island", "--expert-island",
       "MoE: the experts on an island of their own (--expert-parallel more workers), the rows sent there "
       "and back as transfers",
       G::kPathways, &P::expert_island, J::kTrainer, {}, kPathways},
      {"spare_workers", "--spare-workers",
       "workers beyond the slices: a lost worker's slice moves onto one and the run goes on (dense, no "
       "--fsdp; OpenMPI's mpirun --enable-recovery)",
       G::kPathways, &P::spare_workers, J::kTrainer, {}, kPathways},
  };
  return fields;
}

template <typename Part>
nlohmann::json field_json(const Part& p, const Field<Part>& f) {
  return std::visit(
      [&](auto m) -> nlohmann::json {
        using T = std::remove_cvref_t<decltype(p.*m)>;
        if constexpr (std::is_enum_v<T>) return Mode<T>::name(p.*m);
        else return p.*m;
      },
      f.member);
}

template <typename Part>
std::string field_text(const Part& p, const Field<Part>& f) {
  return std::visit(
      [&](auto m) -> std::string {
        using T = std::remove_cvref_t<decltype(p.*m)>;
        if constexpr (std::is_enum_v<T>) return Mode<T>::name(p.*m);
        else if constexpr (std::is_same_v<T, bool>) return p.*m ? "true" : "false";
        else return fmt::format("{}", p.*m);
      },
      f.member);
}

template <typename Part>
bool at_default(const Part& p, const Field<Part>& f) {
  static const Part defaults{};
  return std::visit([&](auto m) { return p.*m == defaults.*m; }, f.member);
}

#define PWM_FIELD_FUNCTIONS(Part)                                                 \
  template nlohmann::json field_json(const Part& p, const Field<Part>& f);       \
  template std::string field_text(const Part& p, const Field<Part>& f);          \
  template bool at_default(const Part& p, const Field<Part>& f);
PWM_FIELD_FUNCTIONS(model::AdamWConfig)
PWM_FIELD_FUNCTIONS(MeshConfig)
PWM_FIELD_FUNCTIONS(ExecConfig)
PWM_FIELD_FUNCTIONS(WorkloadConfig)
PWM_FIELD_FUNCTIONS(OutputConfig)
PWM_FIELD_FUNCTIONS(TestHooks)
PWM_FIELD_FUNCTIONS(MpmdConfig)
#undef PWM_FIELD_FUNCTIONS

}  // namespace pwm::train
