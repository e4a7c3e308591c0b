// The kernels that run between steps: the state's set-up (init, load, copy_state), the
// validation loss, the GEMM peak probe, the memory report, the weights hash, the checkpoint and
// the trace fragment. Their registration: kernels.cc; the step's kernels: step_kernels*.cc,
// pipeline_kernels.cc, island_kernels.cc.
#include <fmt/format.h>

#include <cstring>
#include <memory>

#include "collectives/communicator.h"
#include "common/check.h"
#include "common/memory.h"
#include "train/checkpoint.h"
#include "train/checks.h"
#include "train/full_state.h"
#include "train/peak.h"
#include "train/step.h"
#include "dataflow/buffer.h"
#include "dataflow/kernel.h"
#include "programs/kernels_impl.h"

namespace pwm::programs::kernels {

namespace {

// Full tensors of this tp group and, with expert parallelism, of the experts split over the
// expert-parallel group (every dp replica computes the same).
std::vector<pwm::train::TensorData> full(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const float* buf) {
  const auto gather_over = [](Communicator* c) -> pwm::train::TpGather {
    if (c == nullptr) return {};
    return [c](const float* shard, float* out, size_t n) { c->allgather(shard, out, n, collectives::DataType::kFloat32); };
  };
  std::vector<float> whole;  // --fsdp: the dp shards gathered into the tp layout first
  if (dev.cfg().mesh.fsdp) {
    whole.resize(static_cast<size_t>(dev.layout(p).total()));
    dev.fsdp(ctx, p).gather_full(buf, whole.data());
    buf = whole.data();
  }
  return pwm::train::gather_full(dev.layout(p), buf, gather_over(dev.tp_comm(ctx, p)), gather_over(dev.ep_comm(ctx, p)));
}

// An evaluation's activations when the step is of units (chained, opbyop, a pipeline's stages),
// which bind the object store's buffers and never touch the workspace's own: buffers of the
// step's sizes instead (Shapes::act; one layer's saved state, as Shapes::saved), which the
// buffer pool holds between steps, so the evaluation takes no pages beyond the step's.
// Every layer's saved state in one buffer (a forward reads only its own layer's) and the
// residual streams in two, by turns (block l reads x(l) and writes x(l+1)). With the workspace's own instead, the evaluation made its
// layers' arena resident beside the cached step buffers: compare.sh --moe --full's pw_static row,
// 442 MiB a rank with an evaluation at step 10 against 386 without (docs/results/memory.md). A
// fused step writes the workspace's own every step: left to it.
// Likewise every MoE layer's state is the first MoE layer's: an experts' island's dense device
// keeps no expert rows in its step (its experts' devices do), and an evaluation that gave each
// layer its own made every layer's rows resident there (compare.sh --moe's isl_static: 408 MiB
// on the dense devices with an evaluation at step 10, 278 without).
class EvalActivations {
 public:
  EvalActivations(TrainingDevice& dev, const ParamLayout& layout) : bound_(dev) {
    if (!dev.steps_of_units()) return;
    const int L = static_cast<int>(layout.config().n_layers);
    for (int i = 0; i < 3; ++i) {
      const int64_t n = i < 2 ? dev.shapes().act() : model::Activations<float>::layer_elements(layout, dev.cfg().micro_batch());
      bufs_.push_back(std::make_unique<dataflow::Buffer>(static_cast<size_t>(n) * sizeof(float)));
    }
    for (int l = 0; l <= L; ++l) bound_.act.bind_x(l, data(l % 2));
    for (int l = 0; l < L; ++l) bound_.act.bind_layer(l, data(2));
    model::MoeState<float>* shared = nullptr;
    for (int l = 0; l < L; ++l) {
      if (!layout.layer(l).moe) continue;
      if (!shared) shared = &bound_.act.moe(l);
      bound_.act.bind_moe(l, shared);
    }
  }

 private:
  float* data(int i) { return static_cast<float*>(bufs_[static_cast<size_t>(i)]->data()); }
  std::vector<std::unique_ptr<dataflow::Buffer>> bufs_;  // destroyed after bound_ unbinds
  BoundActivations bound_;
};

// A state array from the tp layout's values `fill` writes: in place, or with --fsdp through one
// full tp buffer, of which the device keeps its dp shard (as spmd_train's constructor).
void state_from(TrainingDevice& dev, KernelContext& ctx, const Pos& p, size_t out,
                const std::function<void(float*)>& fill) {
  if (!dev.cfg().mesh.fsdp) {
    fill(ctx.out<float>(out).data());
    return;
  }
  std::vector<float> whole(static_cast<size_t>(dev.layout(p).total()));
  fill(whole.data());
  dev.fsdp(ctx, p).take_shard(whole.data(), ctx.out<float>(out).data());
}

// Whether the device's step writes the layout-shaped gradient buffer, taken with the state: a
// fused step's, except under --fsdp, whose step writes the gradient shard only (the whole buffer,
// one more copy of the parameters, was resident beside it: ~15 MiB a device at the reference
// model, docs/results/memory.md).
bool fused_grads_buffer(const TrainingDevice& dev) { return !dev.steps_of_units() && !dev.cfg().mesh.fsdp; }

}  // namespace

// The state kernels' position: the slice's (no attrs[1], or -1), or (attrs[1] = j >= 0,
// --expert-island's experts' device j, a slice of one) dp rank j's, whose layout the device holds.
Pos state_pos(const TrainingDevice& dev, const KernelContext& ctx) {
  if (ctx.attrs().size() > 1 && ctx.attr(1) >= 0) return {dev.cfg().mesh.dp, static_cast<int>(ctx.attr(0)), static_cast<int>(ctx.attr(1)), 0};
  return pos(ctx);
}

void init_state(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = state_pos(dev, ctx);
  const ParamLayout& layout = dev.layout(p);
  dev.step_memory(layout);
  if (fused_grads_buffer(dev)) dev.grads();
  state_from(dev, ctx, p, kParams, [&](float* o) { model::init_params(layout, dev.cfg().model.seed, o); });
  for (size_t i : {kAdamM, kAdamV}) std::ranges::fill(ctx.out<float>(i), 0.0f);
  ctx.out<int64_t>(kStep)[0] = 0;
}

void load_state(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = state_pos(dev, ctx);
  const ParamLayout& layout = dev.layout(p);
  dev.step_memory(layout);
  if (fused_grads_buffer(dev)) dev.grads();
  // attrs[2] = 1: an in-job recovery (Trainer::recover) reads the checkpoint this run wrote,
  // without --resume.
  pwm::train::TrainConfig cfg = dev.cfg();
  cfg.outputs.resume = cfg.outputs.resume || (ctx.attrs().size() > 2 && ctx.attr(2) == 1);
  auto ck = pwm::train::load_resume_checkpoint(cfg);
  PWM_CHECK(ck.has_value(), "no checkpoint to resume from at {}", dev.cfg().outputs.ckpt);
  state_from(dev, ctx, p, kParams, [&](float* o) { pwm::train::scatter_full(layout, ck->params, o); });
  state_from(dev, ctx, p, kAdamM, [&](float* o) { pwm::train::scatter_full(layout, ck->adam_m, o); });
  state_from(dev, ctx, p, kAdamV, [&](float* o) { pwm::train::scatter_full(layout, ck->adam_v, o); });
  ctx.out<int64_t>(kStep)[0] = ck->step;
}

void evaluate(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  double comm_s = 0;
  model::Workspace<float>& ws = dev.step_memory(layout);  // before dev.tokens() is taken
  const EvalActivations bound(dev, layout);
  // Replicas (attrs[1] = the island): the island's rows of the flat view, and the island's sum
  // without the division (val_total adds the islands' sums in island order, then divides).
  const bool replica = ctx.attrs().size() > 1;
  const int r = replica ? static_cast<int>(ctx.attr(1)) : 0;
  double sum =
      dev.cfg().mesh.fsdp
          ? dev.fsdp(ctx, p).validation_loss_sum(dev.data(), r * p.dp + p.dp_rank, ctx.in<float>(0).data(), ws, dev.tokens(),
                                                 dev.tp_reducer(dev.tp_comm(ctx, p), &comm_s))
          : pwm::train::validation_loss_sum(dev.flat_cfg(), layout, dev.data(), r * p.dp + p.dp_rank,
                                            ctx.in<float>(0).data(), ws, dev.tokens(),
                                            dev.tp_reducer(dev.tp_comm(ctx, p), &comm_s), dev.expert_alltoall(ctx, p));
  if (Communicator* c = dev.dp_comm(ctx, p))
    c->allreduce(&sum, &sum, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  ctx.out<double>(0)[0] =
      replica ? sum
              : sum / static_cast<double>(pwm::train::validation_batches(dev.cfg(), dev.data()) * dev.cfg().workload.global_batch);
}

// The islands' validation sums (eval with an island attribute), in island order, divided as eval
// divides.
void val_total(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  double sum = 0;
  for (size_t r = 0; r < ctx.num_inputs(); ++r) sum += ctx.in<double>(r)[0];
  ctx.out<double>(0)[0] =
      sum / static_cast<double>(pwm::train::validation_batches(dev.cfg(), dev.data()) * dev.cfg().workload.global_batch);
}

// The device's GEMM peak probe (train/peak.h) for at most about attrs[1] microseconds, or, with
// 0, the start-up probe: its rate, GFLOP/s (0 with --peak-gflops, where the controller never
// calls it).
void gemm_probe(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  model::GemmProbe* probe = dev.gemm_probe();
  const double budget_s = static_cast<double>(ctx.attr(1)) * 1e-6;
  ctx.out<double>(0)[0] = !probe ? 0.0 : budget_s > 0 ? probe->run(budget_s) : pwm::train::startup_probe(*probe);
}

// --spare-workers: a healthy replica's state, arrived as the program's transfers, becomes the
// remapped slice's (Trainer::recover).
void copy_state(TrainingDevice&, KernelContext& ctx, Scope&) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i)
    std::memcpy(ctx.out_raw(i), ctx.in_raw(i), ctx.input_spec(i).bytes());
}

// This worker process's peak resident set (bytes, from common/memory.h), and the state it held
// beyond its arrays: with --fsdp the most gathered weights and gradients at once (0 without).
void memory(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  ctx.out<int64_t>(0)[0] = peak_resident_bytes();
  ctx.out<int64_t>(0)[1] = dev.fsdp_held_bytes();
}

void weights_hash(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const uint64_t h = pwm::train::weights_hash(full(dev, ctx, pos(ctx), ctx.in<float>(0).data()));
  std::memcpy(ctx.out<int64_t>(0).data(), &h, sizeof(h));
}

void save_state(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  pwm::train::Checkpoint ck;
  ck.config = dev.cfg().model;
  ck.step = ctx.in<int64_t>(kStep)[0];
  ck.train_config_json = dev.cfg().workload_json();
  ck.params = full(dev, ctx, p, ctx.in<float>(kParams).data());
  ck.adam_m = full(dev, ctx, p, ctx.in<float>(kAdamM).data());
  ck.adam_v = full(dev, ctx, p, ctx.in<float>(kAdamV).data());
  if (ctx.shard() == 0) pwm::train::save_checkpoint(dev.cfg().outputs.ckpt, ck);
  ctx.out<int64_t>(0)[0] = ck.step;
}

// This worker's trace fragment, as int64 words: [length in bytes, bytes...] (capacity attrs[1]).
void trace_dump(TrainingDevice& dev, KernelContext& ctx) {
  auto o = ctx.out<int64_t>(0);
  std::string f = dev.trace() ? dev.trace()->fragment() : "";
  const size_t cap = (o.size() - 1) * sizeof(int64_t);
  if (f.size() > cap) f = f.substr(0, f.rfind("},", cap - 2) + 1);  // whole events only
  o[0] = static_cast<int64_t>(f.size());
  std::memcpy(o.data() + 1, f.data(), f.size());
}

}  // namespace pwm::programs::kernels
