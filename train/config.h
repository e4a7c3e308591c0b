// The training workload: ONE definition shared by spmd_train and pathways_train, so that both
// trainers run the identical workload by construction. Flags (CLI11) and a JSON config file
// (--config FILE; flags given on the command line override the file) fill the same struct.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/kernels.h"
#include "model/optim.h"
#include "train/modes.h"

namespace pwm::train {

// Mesh: replicas x dp x tp ranks (PaLM's layout). A replica is one island's copy of the model
// (data parallel across islands, over the DCN); inside it dp ranks are data parallel (sharded
// when fsdp) and tp ranks tensor parallel, tp ranks adjacent. World rank =
// (replica * dp + dp_index) * tp + tp_index: replica r holds ranks [r dp tp, (r+1) dp tp), and
// replica * dp + dp_index is the rank's index among all data-parallel ranks (data_parallel()).
struct MeshConfig {
  int replicas = 1;
  int dp = 1;
  int tp = 1;
  // Expert parallelism: each MoE layer's experts are split over `ep` consecutive dp ranks of a
  // replica (an expert-parallel group), tokens dispatched and combined by AllToAll; the experts'
  // gradients are summed over the ranks holding the same experts, the rest over dp as always.
  int ep = 1;
  // The dp axis shards parameters, gradients and AdamW moments (ZeRO-3 / PaLM's sharded data
  // parallelism): weights gathered per layer, gradients reduce-scattered.
  bool fsdp = false;
};

// What is trained on and for how long. With the model and the optimizer (whose total_steps is
// --steps) the batch, data, seed and split are the workload's identity (workload_json); the
// micro-batches and the evaluation cadence are not.
struct WorkloadConfig {
  int64_t global_batch = 16;  // sequences per optimizer step, over all dp ranks
  int64_t microbatches = 1;   // gradient accumulation steps per dp rank
  int64_t steps = 20;
  uint64_t data_seed = 1;
  std::string data;           // text file or directory; empty = default corpus
  double val_fraction = 0.1;
  int64_t eval_every = 0;     // validation loss every N steps (0: only at the end)
  int64_t eval_batches = 4;   // validation batches (of global_batch sequences) per evaluation
  // A step whose loss or gradient norm is non-finite is skipped (no update of the parameters or
  // the AdamW moments; it counts as taken, so the data order stays): up to this many in a run,
  // the next one ends it (train/report.h). 0: the first one ends the run. Not part of the
  // workload's identity (a run may resume with another budget).
  int64_t skip_nonfinite = 0;
};

// What a run writes.
struct OutputConfig {
  int64_t log_every = 5;
  std::string metrics;        // JSON lines
  std::string trace;          // Chrome/Perfetto trace JSON
  std::string ckpt;           // checkpoint path
  int64_t ckpt_every = 0;     // 0: only at the end (when --ckpt is given)
  bool resume = false;        // start from --ckpt if it exists
};

// How the step is executed (not part of the workload identity).
struct ExecConfig {
  // Gradient AllReduce fusion buffer (bucket) size in bytes. 0 (default): sized from the model
  // (collectives::BucketedAllreduce::auto_sizes: a first bucket of at most 1 MiB, then about a
  // quarter of the gradient each, at most DDP's 25 MiB), so that the first AllReduce starts
  // while the backward still runs even when the whole gradient is smaller than 25 MiB
  // (docs/spmd.md). A value >= 1024 cuts every bucket at that size.
  size_t bucket_bytes = 0;
  bool overlap = true;            // overlap the bucket AllReduces with backward compute
  // spmd_train, replicas > 1: how the gradient crosses the replicas (train/modes.h).
  ReplicaReduce replica_reduce = ReplicaReduce::kHierarchical;
  double coll_timeout = 300;      // collectives watchdog, seconds (parse_train_config: PWM_COLL_TIMEOUT, then the flag)
  double peak_gflops = 0;         // per-rank GEMM peak for MFU; 0 = measure at start-up
  // Matrix products: fp32, or bf16 operands with fp32 sums through oneDNN (model/kernels.h
  // Precision). Master weights, AdamW, norms, softmax and loss stay fp32, so a checkpoint
  // resumes in either precision (not part of workload_json).
  model::Precision precision = model::Precision::kFp32;
};

// The MPMD trainers' own settings (pathways_train's and mpmd_train's flags; each registered only by
// the trainer that uses it, FlagSet::kPathways and kStatic in train/flags.h).
struct MpmdConfig {
  Granularity granularity = Granularity::kFused;
  int stages = 1;                       // > 1: pipeline (each stage a dp x tp slice)
  Schedule schedule = Schedule::kGpipe;
  std::string islands;                  // resource manager islands ("" = by host; "KxM")
  bool sequential = false;              // sequential dispatch (the paper's baseline)
  MoeRouting moe_routing = MoeRouting::kAuto;  // how MoE expert calls are sized (modes.h)
  // MoE: the experts on an island of their own (--expert-parallel devices, one slice each), the
  // dense layers on the --dp slice of another; the rows cross between them as program edges.
  bool expert_island = false;
  // Workers beyond the slices: a lost worker's slice is remapped onto one and training goes on
  // in the job (docs/failures.md, "Recovery in the job"; needs OpenMPI's --enable-recovery).
  int spare_workers = 0;
  // The static model's pipeline (mpmd_train): the micro-batches' activations a stage may hold
  // between its forward and its backward, OneFlow's registers (0: what the schedule needs,
  // programs::stage_activations).
  int quota = 0;
  // kAuto resolved against the model: static under a capacity, worker when dropless.
  MoeRouting routing(const model::Config& m) const {
    if (moe_routing != MoeRouting::kAuto) return moe_routing;
    return m.capacity_factor > 0 ? MoeRouting::kStatic : MoeRouting::kWorker;
  }
};

// Testing hooks: faults and pacing the tests schedule.
struct TestHooks {
  // World rank kill_rank gets kill_signal in the middle of step kill_step (-1: never): SIGKILL
  // (a dead process) or SIGSTOP (a stopped one: a hung host; another process may resume it).
  int64_t kill_step = -1;
  int kill_rank = 0;
  enum class KillSignal { kKill, kStop } kill_signal = KillSignal::kKill;
  // Sleep this long at the end of every step (to give an outside kill a window).
  int64_t step_sleep_ms = 0;
  // Step nan_step's loss and gradient norm are made NaN after their reductions, before the
  // update, on every rank: a bad batch on demand (-1: never). train::nonfinite_step applies it.
  int64_t nan_step = -1;
  // A straggler: world rank straggler_rank spends straggler_ms more in every step (0: none), as
  // compute (spmd_train: at its step's start; the MPMD models: in the device's first kernel of
  // each step), so that one stage or one replica runs slower than the others.
  int64_t straggler_ms = 0;
  int straggler_rank = 0;

  // True when world rank `rank` is to die during `step`.
  bool kill_now(int64_t step, int rank) const { return step == kill_step && rank == kill_rank; }
  // Sends this process kill_signal (a stopped one returns when it is resumed).
  void kill_self() const { ::raise(kill_signal == KillSignal::kStop ? SIGSTOP : SIGKILL); }
  bool straggles(int rank) const { return straggler_ms > 0 && rank == straggler_rank; }
};

struct TrainConfig {
  model::Config model;
  model::AdamWConfig optim;
  MeshConfig mesh;
  WorkloadConfig workload;
  OutputConfig outputs;
  ExecConfig exec;
  MpmdConfig mpmd;
  TestHooks hooks;
  // The --config file this configuration was read from ("" if none): an input the outputs may
  // not overwrite. Not part of the configuration the ranks compare.
  std::string config_file;
  // The flags the user gave, as written ("--top-k", "--no-overlap"; a --config key as its flag),
  // for train/flag_use.h. Not part of the configuration the ranks compare.
  std::vector<std::string> given_flags;

  // Throws pwm::Error with one line naming the bad setting and how to fix it. world_size is the
  // number of compute ranks (replicas * dp * tp must equal it).
  void validate(int world_size) const;
  // Checks the testing hooks: --kill-step and --nan-step within the run and --kill-rank in
  // [0, ranks) (ranks: every world rank, a Pathways controller included). Throws pwm::Error with
  // one line.
  void validate_kill_rank(int ranks) const;
  // Data-parallel ranks over all replicas; compute ranks of the mesh.
  int data_parallel() const { return mesh.replicas * mesh.dp; }
  int mesh_ranks() const { return mesh.replicas * mesh.dp * mesh.tp; }
  // Micro-batch size per data-parallel rank.
  int64_t micro_batch() const { return workload.global_batch / data_parallel() / workload.microbatches; }
  int64_t tokens_per_step() const { return workload.global_batch * model.seq_len; }

  // The workload's identity as JSON (model, optimizer, batch, steps' schedule, data, seed): two
  // runs with equal workload_json() train identically; a checkpoint stores it and --resume
  // refuses another. Excludes mesh, outputs and execution settings.
  std::string workload_json() const;
  std::string to_json() const;  // the identity, mesh, micro-batches, steps, evaluation, bucket, overlap, replica reduce, precision: the metrics header
  // Every field, as sorted-key JSON: equal texts <=> equal configurations. The ranks of a job
  // compare its hash before training (a rank started with other flags is named). With `mpmd`,
  // the MPMD settings too, under "trainer". The effective values are compared (coll_timeout after
  // PWM_COLL_TIMEOUT); the PWM_* settings themselves are compared earlier, by MpiEnvironment.
  std::string canonical_json(bool mpmd = false) const;
};

// Throws pwm::Error with one line naming the ranks whose text differs from rank 0's and the
// first differing fields, e.g. "rank 1 started with other flags than rank 0 (rank 1 vs rank 0:
// model/seed=2 vs 1): ...". Index = rank.
void check_same_config(const std::vector<std::string>& canonical_by_rank);
// FNV-1a 64 of a canonical_json() text.
uint64_t config_hash(const std::string& canonical);
// The fields in which two JSON texts differ, "key=A vs B, ..." (at most `max_fields`, then
// "(and N more)"); empty if equal. Nested keys are joined by '/': "optim/lr", "model".
std::string config_differences(const std::string& a, const std::string& b, size_t max_fields = 4);

// Applies cfg.exec.precision to the process (model::set_precision); throws pwm::Error with one
// line if bf16 is asked of a build without oneDNN. Every rank that runs gemm calls it after parsing.
void apply_precision(const TrainConfig& cfg);

}  // namespace pwm::train
