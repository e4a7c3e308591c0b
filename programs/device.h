// The training device: what one device keeps between the training kernels it runs.
//
// Each device (a pathways_train worker, a mpmd_train rank) holds one TrainingDevice: the workload, the dataset, and
// the caches that are not values of any program (the model workspace, the fused step's gradient
// buffer, token scratch, the tp and dp sub-communicators of its slice), like XLA's temporary
// buffers; everything one program node hands to another is a buffer of the run. It also keeps
// the device's step accounting (kernel time since the last step report, collective time of the
// step's earlier kernels) and its kernel trace.
//
// The registered kernel closures capture a DeviceSet (kernels.h) and find their device by the
// executing worker's world rank: one device per MPI worker process, or one per worker thread over
// the in-process transport. A device is used only by its worker's thread (kernels of one worker
// run one at a time), so it needs no lock; the DeviceSet's map is locked.
#pragma once

#include <deque>
#include <map>
#include <span>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/bucketed_allreduce.h"
#include "collectives/communicator.h"
#include "common/trace.h"
#include "train/data.h"
#include "model/gemm_probe.h"
#include "model/params.h"
#include "train/step.h"
#include "model/transformer.h"
#include "train/fsdp.h"
#include "dataflow/kernel.h"
#include "programs/step_io.h"

namespace pwm::programs {

// The mesh position of a shard in a dp x tp training slice (a pipeline stage: 1 x 1).
struct Pos {
  int dp, tp, dp_rank, tp_rank;
  static Pos of(const KernelContext& ctx, int tp);
};

class TrainingDevice {
 public:
  // `transport`: this worker's (for the sub-communicators); `data` may be null for a device that
  // never reads batches (tests of shapes only).
  TrainingDevice(const Shapes& shapes, std::shared_ptr<collectives::Transport> transport,
                 std::shared_ptr<const pwm::train::TextDataset> data);

  const Shapes& shapes() const { return shapes_; }
  const pwm::train::TrainConfig& cfg() const { return shapes_.cfg(); }
  // The configuration as one island of all data-parallel devices (dp = replicas x dp, one
  // replica): what the model's step reads rows and scales gradients by, with data index
  // replica x dp + dp rank (as spmd_train's world rank).
  const pwm::train::TrainConfig& flat_cfg() const { return flat_cfg_; }
  // The shapes changed (DeviceSet::set_replicas): what was made from the old ones goes (the
  // flat configuration is made again; the step memory and the bucket parts on next use).
  void reshaped();
  const pwm::train::TextDataset& data() const;
  const model::ParamLayout& layout(const Pos& p);  // this shard's (cached per tp and expert-parallel rank)
  // Where step-plan piece `piece` of this shard falls in spmd_train's buckets under --bucket-bytes
  // (BucketedAllreduce::cut of the plan's finish order, then parts): the dense ranges' buckets
  // (summed over dp) and, with expert parallelism, the experts' (summed over the expert group).
  // Computed on first use and kept: dp_allreduce asks for it every step.
  struct PieceParts {
    std::vector<collectives::BucketedAllreduce::Part> dense, experts;
  };
  const PieceParts& piece_parts(const Pos& p, int piece);
  // The expert-parallel rank of a device (--expert-parallel P: P consecutive dp ranks split each
  // MoE layer's experts, as spmd_train's mesh); 0 without.
  int ep_rank(const Pos& p) const { return cfg().mesh.ep > 1 ? p.dp_rank % cfg().mesh.ep : 0; }

  // The device's step memory: workspace and token scratch, made once for the layout (the state
  // kernels make it with the state, as spmd_train's constructor makes its own: made in the first
  // step, the workspace's page faults took ~1 s of a chained run's first step).
  model::Workspace<float>& step_memory(const model::ParamLayout& layout);
  // The layout-shaped gradient buffer of a whole-step kernel (the fused step), zeros when first
  // taken; after step_memory. Made on first use: a step of units holds its gradients as values
  // and never takes it (made with the step memory, it kept one more copy of the parameters
  // resident on every chained device). The state kernels take it with the state for a fused run.
  float* grads();
  // Whether this run's steps are of units (chained, opbyop, a pipeline's stages: they bind the
  // object store's buffers into the workspace for each call) rather than one fused kernel.
  bool steps_of_units() const;
  int32_t* tokens() { return tokens_.data(); }
  model::Activations<float>& act() { return ws_->act; }
  // This device's GEMM peak probe (train/peak.h make_gemm_probe), made on first use and kept for
  // the run, so that its products' best times accumulate over the probes; null with --peak-gflops.
  model::GemmProbe* gemm_probe();

  // The slice's tp and dp sub-communicators (nullptr for a group of one), on the slice's
  // sub-contexts (dataflow::kSliceSubContexts): a slice with a fresh context has fresh ones.
  collectives::Communicator* tp_comm(KernelContext& ctx, const Pos& p);
  collectives::Communicator* dp_comm(KernelContext& ctx, const Pos& p);
  // A tp reduction for the model that adds its time to *comm_s.
  model::TpReduce<float> tp_reducer(collectives::Communicator* c, double* comm_s);
  // --fsdp: the sharding of this device's tp layout over its dp group
  // (train/fsdp.h), made on first use over the dp communicator. Which devices call: every
  // member of the dp group, in the same order.
  pwm::train::Fsdp& fsdp(KernelContext& ctx, const Pos& p);
  // Its gradient shard (shard_total() floats), made on first use: a step whose kernel writes the
  // gradient into its own output (the replicas' shard_grads) never makes it.
  float* fsdp_grads(KernelContext& ctx, const Pos& p);
  // Fsdp::peak_gathered_bytes() (0 without --fsdp): what the device held beyond its shards.
  int64_t fsdp_held_bytes() const { return fsdp_ ? fsdp_->peak_gathered_bytes() : 0; }

  // Mixture of Experts (tp = 1). The expert-parallel group (the P devices that split the experts)
  // and the expert group (the devices holding the same experts: their gradients' sum); nullptr
  // for a group of one. The slice's sub-contexts too.
  collectives::Communicator* ep_comm(KernelContext& ctx, const Pos& p);
  collectives::Communicator* expert_comm(KernelContext& ctx, const Pos& p);
  // The model's AllToAll over the expert-parallel group (size 1 without --expert-parallel). The
  // counts are exchanged among the devices (static and worker routing), or, with `counts` (the
  // controller's routing: Shapes::route_counts, what the controller put on this device), read
  // from it with no exchange (the device checks that its own row is what its router chose). Its time goes to the step's communication and its AllToAll time.
  model::ExpertComm<float> expert_alltoall(KernelContext& ctx, const Pos& p, std::span<const int64_t> counts = {});
  // The MoE state of a layer's forward, kept from its block_fwd to its block_bwd by the saved(l)
  // buffer it belongs to (a dropless layer's state has data-dependent sizes: it is not an
  // object-store value). keep_moe moves the state in; take_moe moves it out (it must be there).
  void keep_moe(const float* saved, model::MoeState<float>& st);
  void take_moe(const float* saved, model::MoeState<float>& st);
  // The step's MoE statistics, summed over its kernels until report() writes and clears them.
  // With `order` (micro-batch x layers + layer), summed in that order at report() whatever
  // order the kernels ran in (--expert-island's forwards of two micro-batches interleave while
  // their experts run elsewhere): the statistics' sums in spmd_train's order.
  void add_moe(const model::MoeStats& s) { moe_.add(s); }
  void add_moe(const model::MoeStats& s, int64_t order) { moe_ordered_[order].add(s); }

  // Step accounting. Kernels that communicate add their collective time; the step's last kernel
  // (fused step, update, pipeline update) calls report(): the busy time since the previous
  // report including the running kernel up to now, the communication, and the end time.
  void add_comm(double s) { comm_s_ += s; }
  class KernelScope;
  // The running kernel is a block forward the controller routed (--moe-routing controller): the
  // time since this device's previous kernel ended, which it spent waiting for the controller's
  // round trip, goes to the step's routing wait (StepStats::moe).
  void routed(const KernelScope& running);
  // --expert-island: the running kernel takes the experts' outputs (or their input gradients)
  // back from the experts' island; the time since this device's previous kernel ended, spent
  // waiting for the rows to cross and the experts to run, goes to the step's AllToAll time (the
  // island's counterpart of the exchange inside the block kernels).
  void waited_for_experts(const KernelScope& running);
  // Replicas: the running kernel ends this device's backward pass (its last gradient is ready);
  // exchange_exposed_s(), called when the update starts, is the time since then not spent in
  // kernels: waiting for the other islands' gradients (StepStats::xchg_exposed_ms).
  void backward_done(const KernelScope& running);
  double exchange_exposed_s() const;
  // On the controller's clock (now_us() minus this rank's measured offset): backward_done's time.
  double backward_end_ctrl_us() const { return static_cast<double>(bwd_end_us_ - clock_offset_us_); }
  double now_ctrl_us() const;
  // With an MoE model the statistics also carry the step's MoE figures (StepStats::moe).
  void report(KernelScope& running, pwm::train::UpdateResult u, double loss, double kernel_comm_s, std::span<double> out,
              const StepStats* exchange = nullptr);

  // Non-blocking dp reductions (the pipeline's stage gradients, XLA's all-reduce-start/-done):
  // start_reduce starts the AllReduce of `in` over the dp group into `out` and returns at once;
  // poll_reduces() progresses every started one without blocking (the kernel wrapper calls it
  // before and after every kernel, so the sums advance between the backward kernels, as
  // spmd_train's buckets advance between its layers; there is no progress thread); finish_reduce
  // waits for the oldest one, which must be the one into `out`. `in` and `out` are the caller's
  // (object-store buffers the program keeps alive until finish_reduce: its node reads both).
  // Which devices call: every member of the dp group, the same starts and finishes in the same
  // order. The span from start to the completion seen by a poll or the finish goes to the trace
  // ("dp_reduce layer L", category "reduce"); the time inside them is the step's communication.
  void start_reduce(KernelContext& ctx, const Pos& p, std::span<const float> in, std::span<float> out, int layer);
  // The same for --fsdp's reduce-scatter of layer `layer`'s full gradient into the device's chunk
  // (Fsdp::start_reduce_layer; finished by finish_reduce(chunk)).
  void start_layer_reduce_scatter(KernelContext& ctx, const Pos& p, int layer, const float* grads, float* chunk);
  void poll_reduces();
  void finish_reduce(const float* out);
  // The step's run was cancelled (a device was lost; collectives::Interrupted inside a kernel):
  // the step is abandoned on this device, its started reductions with it (their collectives
  // withdrawn without waiting), its MoE state and its accounting dropped. The kernel wrapper
  // calls it on Interrupted, pathways_train's worker on a cancel (WorkerOptions::on_cancel).
  void abandon_step();
  // Contexts [first, first + n) were reclaimed (pathways_train's worker, WorkerOptions::
  // on_context_reclaimed): the sub-group communicators on them are dropped from the cache, so
  // that a slice given the block again starts their sequence numbers at 0. (The objects stay
  // alive, unused: a pointer taken before, an FSDP sharding's, never dangles.)
  void forget_contexts(uint32_t first, uint32_t n);

  Trace* trace() { return trace_.get(); }

 private:
  struct PendingReduce {
    collectives::Work work;
    const float* out;
    int layer;
    int64_t start_us;
    bool done = false;
  };
  void reduce_done(PendingReduce& r);
  std::deque<PendingReduce> reduces_;  // started, in start order
  friend class KernelScope;
  collectives::Communicator& comm(uint32_t context, std::vector<int> group);

  const Shapes& shapes_;
  std::shared_ptr<collectives::Transport> transport_;
  std::shared_ptr<const pwm::train::TextDataset> data_;
  std::map<std::tuple<int, int, int>, model::ParamLayout> layouts_;  // by tp, tp rank, ep rank
  std::map<std::tuple<int, int, int, int>, PieceParts> piece_parts_;  // by tp, tp rank, ep rank, piece
  std::unique_ptr<model::Workspace<float>> ws_;
  std::unique_ptr<model::GemmProbe> probe_;
  bool probe_made_ = false;
  std::vector<float> grads_;
  int64_t grads_n_ = 0;  // the layout's total (step_memory)
  std::vector<int32_t> tokens_;
  std::map<std::pair<uint32_t, std::vector<int>>, std::unique_ptr<collectives::Communicator>> comms_;
  std::vector<std::unique_ptr<collectives::Communicator>> forgotten_comms_;  // forget_contexts
  double busy_s_ = 0;  // step kernels' time since the last report
  bool straggler_ = false, straggled_ = false;  // --straggler-ms names this device; it slept this step
  double comm_s_ = 0;  // collectives of this step's earlier kernels
  double alltoall_s_ = 0;  // the step's expert AllToAlls (also in comm_s_ or the kernel's own)
  double route_wait_s_ = 0;  // the step's idle time before routed block forwards (routed())
  int64_t last_kernel_end_us_ = -1;
  model::MoeStats moe_;     // the step's MoE statistics
  std::map<int64_t, model::MoeStats> moe_ordered_;  // add_moe with an order
  std::map<const float*, model::MoeState<float>> moe_saved_;  // keep_moe / take_moe
  std::vector<model::MoeState<float>> moe_spare_;              // given back by take_moe, for reuse
  int64_t bwd_end_us_ = -1;  // backward_done's time, and the busy time up to it
  double busy_at_bwd_s_ = 0;
  pwm::train::TrainConfig flat_cfg_;
  int64_t clock_offset_us_ = 0;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<pwm::train::Fsdp> fsdp_;
  std::vector<float> fsdp_grads_;
};

// Times one kernel: its span goes to the device's trace and, for the kernels of a training step,
// its time to the device's busy time. A step's last kernel reports its own time so far through
// TrainingDevice::report, which restarts the scope's clock: only the rest is added at its end.
class TrainingDevice::KernelScope {
 public:
  KernelScope(TrainingDevice& dev, const std::string& name, bool step_work);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
  double elapsed_s() const;  // since the kernel started (not restarted by report)

 private:
  friend class TrainingDevice;
  TrainingDevice& dev_;
  const std::string& name_;
  bool step_work_;
  int64_t start_us_, counted_from_us_;
};

// The shared workspace's activations bound to a node's buffers for the duration of the node:
// restores the owned memory when the node ends (the buffers may be freed afterwards).
struct BoundActivations {
  explicit BoundActivations(TrainingDevice& d) : act(d.act()) {}
  ~BoundActivations() { act.unbind_all(); }
  model::Activations<float>& act;
};

}  // namespace pwm::programs
