// The Transformer's compiled functions, for both MPMD models (pathways_train, mpmd_train).
//
// Registered by name on every rank (signatures check and lower the programs; the devices run
// them: pathways' workers, every rank of the static model). Each kernel runs once per device of
// its slice, over the run's buffers; per-device shards
// follow the SPMD trainer's mesh: a slice of dp x tp devices, device k = dp index k / tp, tp
// index k % tp, so device k holds exactly what SPMD's world rank k holds, and runs the same
// floating-point operations (model/step_plan.h, train/step.h), which is why the two
// trainers agree bitwise. Names, shapes and argument positions: step_io.h. What each device
// keeps between kernels: device.h.
//
// Where the kernels are: kernels.cc (the registration, DeviceSet), state_kernels.cc (state,
// evaluation, hash, checkpoint, trace), step_kernels.cc (the fused step and the step's tail),
// step_kernels_units.cc (one kernel per plan unit kind, the dp reduction and the update),
// step_kernels_fsdp.cc (--fsdp's), step_kernels_replicas.cc (replicas'), pipeline_kernels.cc
// (the MPMD pipeline's norm and update, merge), island_kernels.cc (--expert-island: an MoE
// layer's block around the experts' own devices); what their sources share: kernels_impl.h.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "collectives/transport.h"
#include "train/data.h"
#include "programs/device.h"
#include "programs/step_io.h"

namespace pwm::programs {

// The training devices of the worker ranks this process runs, by world rank: one in an MPI
// worker process, none on the controller, several over the in-process transport (one per worker
// thread). The registered kernels capture it (shared ownership: the registry outlives callers).
class DeviceSet {
 public:
  explicit DeviceSet(const pwm::train::TrainConfig& cfg, PipelineShape pipe = {}) : shapes_(cfg, pipe) {}
  const Shapes& shapes() const { return shapes_; }
  // Makes the device of world rank transport->rank(), for as long as the returned object lives.
  // Call on that worker's thread or process before it starts run_worker, and keep the result
  // until run_worker returns: the device (its sub-communicators) must go while the transport is
  // still up, not when the kernel registry goes at exit. Thread-safe.
  class Attached {
   public:
    Attached(DeviceSet* set, int rank) : set_(set), rank_(rank) {}
    Attached(Attached&& o) noexcept : set_(std::exchange(o.set_, nullptr)), rank_(o.rank_) {}
    Attached(const Attached&) = delete;
    Attached& operator=(const Attached&) = delete;
    Attached& operator=(Attached&&) = delete;
    ~Attached() {
      if (set_) set_->detach(rank_);
    }

   private:
    DeviceSet* set_;
    int rank_;
  };
  [[nodiscard]] Attached attach(std::shared_ptr<collectives::Transport> transport,
                                std::shared_ptr<const pwm::train::TextDataset> data);
  // The device of the worker running a kernel; throws if it was never attached. Thread-safe.
  TrainingDevice& at(int world_rank);
  // The job goes on with `replicas` replicas of the same global batch (pathways_train's recovery
  // with no spare left: Trainer::recover): the shapes become a run's with that many (each
  // device's share of the batch, its gradient scale, the kernels' signatures), and every
  // device's configuration with them. Only while nothing reads the shapes: the controller
  // between steps, a worker in the set_replicas kernel (its device runs one kernel at a time).
  void set_replicas(int replicas);

 private:
  void detach(int world_rank);
  Shapes shapes_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<TrainingDevice>> devices_;
};

// Registers every training kernel, named names(kernel), in the process's kernel registry.
// Call once per process and prefix, on every rank, before the runtime or the worker starts;
// throws if a name is taken.
void register_train_kernels(const KernelNames& names, std::shared_ptr<DeviceSet> devices);

// The kernel bodies (the sources above). `scope` times the running kernel; the step's last
// kernel hands it to TrainingDevice::report.
using Scope = TrainingDevice::KernelScope;
namespace kernels {
void init_state(TrainingDevice&, KernelContext&, Scope&);
void load_state(TrainingDevice&, KernelContext&, Scope&);
void copy_state(TrainingDevice&, KernelContext&, Scope&);
void evaluate(TrainingDevice&, KernelContext&, Scope&);
void val_total(TrainingDevice&, KernelContext&, Scope&);
void gemm_probe(TrainingDevice&, KernelContext&, Scope&);
void memory(TrainingDevice&, KernelContext&, Scope&);
void weights_hash(TrainingDevice&, KernelContext&, Scope&);
void save_state(TrainingDevice&, KernelContext&, Scope&);
// (Registered untimed, without a Scope: kernels.cc.)
void trace_dump(TrainingDevice&, KernelContext&);
void fused_step(TrainingDevice&, KernelContext&, Scope&);
void batch(TrainingDevice&, KernelContext&, Scope&);
void embed_fwd(TrainingDevice&, KernelContext&, Scope&);
void block_fwd(TrainingDevice&, KernelContext&, Scope&);
void moe_counts(TrainingDevice&, KernelContext&, Scope&);
void head(TrainingDevice&, KernelContext&, Scope&);
void block_bwd(TrainingDevice&, KernelContext&, Scope&);
void embed_bwd(TrainingDevice&, KernelContext&, Scope&);
void dp_allreduce(TrainingDevice&, KernelContext&, Scope&);
void dp_reduce_start(TrainingDevice&, KernelContext&, Scope&);
void dp_reduce_finish(TrainingDevice&, KernelContext&, Scope&);
void update(TrainingDevice&, KernelContext&, Scope&);
void fused_grads(TrainingDevice&, KernelContext&, Scope&);
void shard_grads(TrainingDevice&, KernelContext&, Scope&);
void tied_reduce_scatter(TrainingDevice&, KernelContext&, Scope&);
void fsdp_gather(TrainingDevice&, KernelContext&, Scope&);
void fsdp_rs_start(TrainingDevice&, KernelContext&, Scope&);
void fsdp_rs_finish(TrainingDevice&, KernelContext&, Scope&);
void fsdp_reduce_scatter(TrainingDevice&, KernelContext&, Scope&);
void sharded_update(TrainingDevice&, KernelContext&, Scope&);
void island_loss(TrainingDevice&, KernelContext&, Scope&);
void replica_add(TrainingDevice&, KernelContext&, Scope&);
void dp_reduce_scatter(TrainingDevice&, KernelContext&, Scope&);
void dp_allgather(TrainingDevice&, KernelContext&, Scope&);
void replica_update(TrainingDevice&, KernelContext&, Scope&);
void pipe_sqnorm(TrainingDevice&, KernelContext&, Scope&);
void pipe_update(TrainingDevice&, KernelContext&, Scope&);
void merge(TrainingDevice&, KernelContext&, Scope&);
void zeros(TrainingDevice&, KernelContext&, Scope&);
void add_arrays(TrainingDevice&, KernelContext&, Scope&);
void sum_scalars(TrainingDevice&, KernelContext&, Scope&);
// --expert-island (island_kernels.cc).
void moe_send(TrainingDevice&, KernelContext&, Scope&);
void expert_fwd(TrainingDevice&, KernelContext&, Scope&);
void moe_combine(TrainingDevice&, KernelContext&, Scope&);
void moe_bwd_send(TrainingDevice&, KernelContext&, Scope&);
void expert_bwd(TrainingDevice&, KernelContext&, Scope&);
void block_bwd_remote(TrainingDevice&, KernelContext&, Scope&);
void expert_sqnorm(TrainingDevice&, KernelContext&, Scope&);
void expert_update(TrainingDevice&, KernelContext&, Scope&);
void expert_pack(TrainingDevice&, KernelContext&, Scope&);
void expert_merge(TrainingDevice&, KernelContext&, Scope&);

// AdamW out of place on the parameters `mine` selects (the state's kParams, kAdamM, kAdamV inputs
// to the same outputs), the others passed through, and every one passed through with `skip` (a
// non-finite step): the pipeline's stages and the expert island's two sides update their parts
// so (pipeline_kernels.cc).
void update_where(const pwm::train::TrainConfig& cfg, KernelContext& ctx, const model::ParamLayout& layout,
                  const model::GradView& grads, int64_t step, double lr, double clip, bool skip,
                  const std::function<bool(const model::ParamInfo&)>& mine);

// What a block kernel (attrs: tp, layer) works with.
struct BlockUnit {
  BlockUnit(TrainingDevice& dev, const KernelContext& ctx)
      : p(Pos::of(ctx, static_cast<int>(ctx.attr(0)))), layer(static_cast<int>(ctx.attr(1))), layout(dev.layout(p)),
        ws(dev.step_memory(layout)) {}
  Pos p;
  int layer;
  const model::ParamLayout& layout;
  model::Workspace<float>& ws;
};
}  // namespace kernels

}  // namespace pwm::programs
