// What the training programs and the training kernels agree on, written once: the kernels' names,
// the shapes of their arguments, the position of every argument by name, and the step
// statistics a step's last kernel writes and the trainer reads.
//
// The traces (trace_impl.h, pipeline.cc, and the trainers' own small programs) and the kernels
// (kernels.cc, step_kernels.cc, pipeline_kernels.cc) both use these structs: neither computes the
// other's positions. Shapes come from the workload only (no device, no MPI): programs are
// checked and lowered with them, the devices run the kernels with the same ones.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/check.h"
#include "model/params.h"
#include "model/step_plan.h"
#include "train/config.h"
#include "train/report.h"
#include "dataflow/kernel.h"

namespace pwm::programs {

using collectives::DataType;
using dataflow::ArgSpec;
using dataflow::KernelContext;
using dataflow::KernelDef;
using dataflow::KernelFn;
using dataflow::KernelRegistry;
using dataflow::Sharding;
using dataflow::Signature;
using dataflow::TensorSpec;

struct PipelineShape {
  int stages = 1;
  // Layers of stage s: [layer_begin(s), layer_begin(s+1)).
  int layer_begin(int s, int n_layers) const { return static_cast<int>(static_cast<int64_t>(n_layers) * s / stages); }
};

// Kernel names: `prefix` + the kernel's own name ("pw_" in pathways_train). The kernel registry
// is one per process; a process that trains twice with different workloads (the in-process
// tests) registers each under its own prefix.
struct KernelNames {
  std::string prefix = "pw_";
  std::string operator()(const std::string& kernel) const { return prefix + kernel; }
  // The per-unit kernel of a plan unit: "block_fwd", "block_fwd_tp" (with tp collectives),
  // "block_bwd_tp_acc" (adding to the previous micro-batch's gradient piece), ...
  // expert_exchange: an MoE layer's block with its experts split over devices ("block_fwd_ep",
  // "block_bwd_ep[_acc]": the AllToAll inside, gang-scheduled).
  std::string unit(const model::Unit& u, int tp, bool expert_exchange = false) const;
};

// Per-device shapes of a workload's buffers (elements), for a slice of tp-way tensor parallelism.
// Immutable after construction; safe from any thread.
class Shapes {
 public:
  Shapes(const pwm::train::TrainConfig& cfg, PipelineShape pipe);
  const pwm::train::TrainConfig& cfg() const { return cfg_; }
  PipelineShape pipe() const { return pipe_; }
  const model::ParamLayout& layout(int tp) const;  // tp rank 0's (every rank's sizes are equal)
  const model::StepPlan& plan(int tp) const;
  int64_t total(int tp) const { return layout(tp).total(); }                                    // params, m, v
  int64_t act() const { return cfg_.micro_batch() * cfg_.model.seq_len * cfg_.model.d_model; }  // x(l), dx(l): [N, C]
  int64_t tokens() const { return cfg_.micro_batch() * (cfg_.model.seq_len + 1); }
  int64_t saved(int tp) const;                                                // one layer's activations
  int64_t piece(int tp, int p) const { return plan(tp).piece_size(p); }       // a gradient piece
  std::vector<ArgSpec> state(int tp) const;                                   // State's specs
  // The floats of each of params, m and v on a device: total(tp), or with --fsdp its dp shard.
  int64_t state_floats(int tp) const;
  // --fsdp: the floats of piece i of the shard (train/fsdp.h chunk_sizes: 0 the embedding, 1 + l
  // layer l, L + 1 the final norm).
  int64_t fsdp_chunk(int tp, int i) const;
  // --fsdp (chained, opbyop): a gathered layer as an array, D * fsdp_chunk floats (the layer, then
  // zero padding): its weights (fsdp_gather) or its full gradient (block_bwd's output).
  int64_t fsdp_gathered_layer(int tp, int l) const { return cfg_.mesh.dp * fsdp_chunk(tp, 1 + l); }
  // The embedding's and final norm's weights gathered (held by the device's Fsdp for the step).
  int64_t fsdp_gathered_tied(int tp) const {
    return cfg_.mesh.dp * (fsdp_chunk(tp, 0) + fsdp_chunk(tp, static_cast<int>(cfg_.model.n_layers) + 1));
  }
  int64_t stats_words() const;  // StepStats::words of the model, per device
  bool moe_layer(int layer) const { return cfg_.model.moe() && cfg_.model.moe_layer(layer); }
  // Layer `layer` exchanges rows between devices (an MoE layer under --expert-parallel > 1).
  bool expert_exchange(int layer) const { return cfg_.mesh.ep > 1 && moe_layer(layer); }
  // What the controller's routing puts on each device for an MoE layer's block_fwd (split, 2E
  // int64 per device): the rows it receives for its experts from each member of its
  // expert-parallel group (group order, then expert), then its own rows per expert (its router's,
  // which the device checks).
  ArgSpec route_counts() const;

  // --expert-island: the experts of every MoE layer on P = --expert-parallel devices of their own,
  // one slice each (experts' device j holds expert-parallel rank j's experts, the state of that
  // rank's layout, of which it updates the experts), the dense layers on the --dp slice (dp = P).
  // A device of the dense slice sends each experts' device one block of rows per MoE layer and
  // micro-batch: island_rows() rows of d_model (its rows for that device's experts, expert-major;
  // under a capacity exactly El x capacity, dropless at most N min(K, El), the rest unused) and
  // El int64 counts (the rows of each expert in the block).
  bool expert_island() const { return cfg_.mpmd.expert_island && cfg_.model.moe(); }
  int64_t island_rows() const;
  ArgSpec island_block() const;         // split: one block per device of the dense slice
  ArgSpec island_counts() const;        // split: El counts per device of the dense slice
  ArgSpec island_blocks() const;        // on an experts' device: the dense slice's blocks, in shard order
  ArgSpec island_blocks_counts() const;

 private:
  pwm::train::TrainConfig cfg_;
  PipelineShape pipe_;
  std::vector<model::ParamLayout> layouts_;  // tp = 1 and cfg.mesh.tp
  std::vector<model::StepPlan> plans_;
};

ArgSpec split_f32(int64_t n);
ArgSpec split_f64(int64_t n);
ArgSpec split_i32(int64_t n);
ArgSpec rep_i64(int64_t n);
ArgSpec rep_f32(int64_t n);
ArgSpec rep_f64(int64_t n);

// A device's training state: what each step consumes and returns.
template <typename V>
struct State {
  V params, m, v, step;
  static constexpr size_t kCount = 4;
  std::vector<V> list() const { return {params, m, v, step}; }
  static State from(std::span<const V> a) {
    PWM_CHECK(a.size() >= kCount, "a state is {} values, got {}", kCount, a.size());
    return {a[0], a[1], a[2], a[3]};
  }
};
enum StateArg : size_t { kParams = 0, kAdamM, kAdamV, kStep };

// What every step kernel returns: the next state, then the statistics.
template <typename V>
struct StepOutputs {
  State<V> state;
  V stats;
  static constexpr size_t kCount = State<V>::kCount + 1;
  static constexpr size_t kStats = State<V>::kCount;  // the statistics' output position
  static StepOutputs from(std::span<const V> a) {
    PWM_CHECK(a.size() == kCount, "a step returns {} values, got {}", kCount, a.size());
    return {State<V>::from(a), a[kStats]};
  }
};

// What one step reports per device (float64[kWords] per device, written by the step's last
// kernel). busy_ms: the time the device spent in step kernels since the previous report (its
// own kernel included); end_us: the worker's monotonic clock when the step's last kernel ended,
// so step times are differences of consecutive ends on one device, free of the controller.
// xchg_exposed_ms (replicas > 1): the time between the end of the device's backward pass and the
// start of its update not spent in kernels, i.e. waiting for the other islands' gradients: the
// part of the cross-island exchange that compute did not hide. bwd_end_us, update_start_us: when
// the device's backward ended and its update started, on the controller's clock (the runtime's
// measured offsets), so that the controller can tell waiting for a slower island's backward
// from waiting for the transfer.
// moe (MoE models): the device's train::pack_moe_stats for the step, then its time in the
// expert AllToAlls and its idle time before the block forwards the controller routed (ms):
// words(E, calls) - kWords words (calls: the step's routing calls on a device at most, MoE layers x
// micro-batches; a device that routes fewer leaves the rest zero).
struct StepStats {
  double loss = 0, grad_norm = 0, lr = 0;
  double compute_ms = 0, comm_ms = 0, kernel_ms = 0, busy_ms = 0, end_us = 0, xchg_exposed_ms = 0;
  double bwd_end_us = 0, update_start_us = 0;
  std::vector<double> moe;
  static constexpr int64_t kWords = 11;
  // A device's words for a model of `experts` experts (0: dense) routing `calls` calls a step.
  static int64_t words(int64_t experts, int64_t calls) { return kWords + (experts > 0 ? 7 + experts * (1 + calls) : 0); }
  // The routing calls a device's step statistics hold room for.
  static int64_t calls(const pwm::train::TrainConfig& cfg) { return cfg.model.moe_layers() * cfg.workload.microbatches; }
  void write(std::span<double> out) const;
  static StepStats read(std::span<const double> in);
  // One per device of a slice's fetched statistics array (`words` per device).
  static std::vector<StepStats> read_all(const std::vector<double>& all, int64_t words);
};

// A step's record from every device's statistics (`last`: the one that holds the loss): the
// step time is the latest end of the step's last kernel minus the previous step's (*last_end_us,
// updated; negative after a pause: the busiest device's busy time instead), per device its
// compute, its communication or waiting (for a peer or for dispatch) and its wait; `bubble` is
// 1 - the devices' mean busy time over the step time (a pipeline's bubble).
struct StepTiming {
  pwm::train::StepRecord record;
  double bubble = 0;
};
StepTiming step_timing(int64_t step, const std::vector<StepStats>& devices, const StepStats& last, double* last_end_us);

// The replicas' exchange in one step, from every device's statistics (ms): the mean over the
// devices of the time between the end of its backward and the start of its update not spent in
// kernels (waiting for the other replicas' gradients: the exchange compute did not hide), and the
// mean time from the end of the last replica's backward (every gradient exists) to each device's
// update, on rank 0's clock (a slower replica's backward is not in it).
struct ExchangeTimes {
  double exposed_ms = 0, tail_ms = 0;
};
ExchangeTimes exchange_times(const std::vector<StepStats>& devices);
// An MoE step's record from every device's statistics (as spmd_train's from every rank's): the
// routing figures of their sum, each device's AllToAll time and routing wait, and the
// controller's round trips (0 in a model without a controller).
pwm::train::MoeRecord moe_record(const std::vector<StepStats>& devices, const pwm::train::TrainConfig& cfg,
                                 uint64_t round_trips);
// Bytes between the replicas per step: every device sends each piece (dp > 1: its 1/dp chunk;
// --fsdp: its gradient shard) and its loss to its peer in each other replica.
double replica_bytes_per_step(const Shapes& sh, int devices_per_replica);

// Inputs of the per-unit kernels, by name.
enum HeadArg : size_t { kHeadParams = 0, kHeadX, kHeadTokens, kHeadTiedPrev };       // -> loss, dx, tied
enum HeadOut : size_t { kHeadLoss = 0, kHeadDx, kHeadTied };
enum BlockBwdArg : size_t { kBwdParams = 0, kBwdSaved, kBwdX, kBwdDx, kBwdGradPrev };  // -> dx, g
enum BlockBwdOut : size_t { kBwdDxOut = 0, kBwdGrad };
enum EmbedBwdArg : size_t { kEBwdTokens = 0, kEBwdDx, kEBwdTied };                   // -> tied

// The update's inputs: the state, the gradient pieces (one per piece of the slice's plan, or
// only the pipeline stage's: the tied piece, then its layers), the micro-batch losses, and for
// the pipeline the total squared norm. One struct orders them for both sides.
struct UpdateArgs {
  size_t pieces = 0, losses = 0;
  bool total_sq = false;  // the pipeline's: the squared norm summed over the stages
  size_t piece(size_t i) const { return State<int>::kCount + (total_sq ? 1 : 0) + i; }
  size_t loss(size_t m) const { return piece(pieces) + m; }
  size_t sq() const { return State<int>::kCount; }
  size_t count() const { return loss(losses); }
  template <typename V>
  std::vector<V> pack(const State<V>& s, const V* total, const std::vector<V>& p, const std::vector<V>& l) const {
    PWM_CHECK(p.size() == pieces && l.size() == losses && (total != nullptr) == total_sq, "update arguments");
    std::vector<V> in = s.list();
    if (total) in.push_back(*total);
    in.insert(in.end(), p.begin(), p.end());
    in.insert(in.end(), l.begin(), l.end());
    PWM_CHECK_EQ(in.size(), count());
    return in;
  }
};

// The pipeline stage s's layers and update arguments (pipe_update: the state, the total squared
// norm, the stage's pieces (the tied piece, then its layers), and on the last stage one loss:
// island_loss's dp sum of the devices' micro-batch means).
struct StageLayers {
  int begin, end;
};
StageLayers stage_layers(const Shapes& sh, int stage);
// The pipeline's update on `stage`: the state, the squared norm, the stage's pieces (the tied one,
// then its layers'), and on the last stage every replica's loss in replica order.
UpdateArgs pipe_update_args(const Shapes& sh, int stage);
UpdateArgs update_args(const Shapes& sh, int tp);
// The replicas' update (replica_update): the state, the pieces summed over the islands (--fsdp:
// the gradient shard, one piece, or with fsdp_chunks its chunks in shard order: the embedding,
// the layers, the final norm), and one loss per island (the island's dp sum of its devices'
// micro-batch means), in island order.
UpdateArgs replica_update_args(const Shapes& sh, int tp, bool fsdp_chunks = false);

// The replicas' kernels' attributes after tp (attrs[0]): the island (replica) index where the
// kernel reads data or scales by it. Every replica kernel takes the number of replicas from the
// configuration (cfg().mesh.replicas).
struct ReplicaAttrs {
  static constexpr size_t kBatchReplica = 2;  // batch: tp, micro-batch, replica
  static constexpr size_t kFusedReplica = 1;  // fused_grads: tp, replica, shards
  static constexpr size_t kFusedShards = 2;   // 1: whole pieces; dp: each device's chunk
  static constexpr size_t kAddInto = 3;       // replica_add: tp, size, replicas, the input it sums into
};

// replica_add's attrs on replica r: a piece (or chunk) of `size` floats from each of `replicas`.
// The sum is written over another replica's copy (kAddInto): a received one, which the kernel
// alone reads (r's own is also read by its sends), so the sum takes no buffer of its own.
inline std::vector<int64_t> replica_add_attrs(int tp, int64_t size, int replicas, int r) {
  return {tp, size, replicas, r == 0 ? 1 : 0};
}

// With dp > 1 devices per island, the islands exchange each piece in dp chunks, device k of one
// island with device k of the other (1/dp of the piece each): chunk k is elements
// [k c, (k + 1) c) of the piece's n, c = ceil(n / dp), the last one zero-padded.
inline size_t replica_chunk(int64_t n, int dp) { return static_cast<size_t>((n + dp - 1) / dp); }
// dst (replica_chunk(src.size(), dp) elements) = chunk k of src, zero-padded.
void copy_chunk(std::span<const float> src, int k, std::span<float> dst);

}  // namespace pwm::programs
