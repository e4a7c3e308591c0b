// The whole training step in one kernel (fused_step), and what every granularity's step ends
// with: the global squared norm, the loss mean over dp and AdamW (finish_step), and the plan
// executed directly with the bucketed dp AllReduce inside (fused_gradients, also the replicas'
// fused_grads). Every step kernel calls the model functions the plan's executor in train/step.cc
// calls, on the same values, so all granularities compute the same bits as spmd_train. The
// other step kernels: step_kernels_units.cc (one kernel per unit kind of the step plan: chained,
// opbyop and the pipeline's stages; the dp reduction of a gradient piece; the update),
// step_kernels_fsdp.cc (--fsdp), step_kernels_replicas.cc (replicas); shared: kernels_impl.h.
#include <cmath>
#include <cstring>

#include "collectives/bucketed_allreduce.h"
#include "common/time.h"
#include "common/trace.h"
#include <fmt/format.h>
#include "model/optim.h"
#include "train/step.h"

#include <csignal>
#include "programs/kernels_impl.h"

namespace pwm::programs::kernels {

namespace {

// This device's squared gradient norm before the tp sum, as spmd_train computes it: with expert
// parallelism the dense part (the same on every device) plus the experts' summed over the
// expert-parallel group; with --expert-island `given` (island_sq_norm: the experts' gradients are
// not here).
double sq_norm(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const ParamLayout& layout,
               const model::GradView& grads, double* comm_s, const double* given) {
  if (given) return *given;
  Communicator* ep = dev.ep_comm(ctx, p);
  if (ep == nullptr) return model::grad_sq_norm_tp(layout, grads);
  double experts = model::grad_sq_norm_tp(layout, grads, model::NormPart::kExperts);
  const double t0 = now_s();
  ep->allreduce(&experts, &experts, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  *comm_s += now_s() - t0;
  return model::grad_sq_norm_tp(layout, grads, model::NormPart::kDense) + experts;
}

}  // namespace

// The global squared norm, the loss mean over dp, AdamW (in place when the state was donated:
// Signature::reuse; else out of place): exactly spmd_train's tail.
// --expert-island: `given_sq` is this device's squared norm (sq_norm), and `shared` gets the
// loss and the squared norm the experts' devices' update needs (before the non-finite hook).
pwm::train::UpdateResult finish_step(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const ParamLayout& layout,
                                int64_t step, double local_loss, const model::GradView& grads, double* comm_s,
                                double* loss_out, const double* replicas_loss_sum,
                                const double* given_sq, double* shared) {
  // Testing hook (--kill-step/--kill-rank naming a worker): this worker dies in the middle of the
  // step, after its gradients and before the update, as spmd_train's rank does.
  if (dev.cfg().hooks.kill_now(step, ctx.world_rank())) dev.cfg().hooks.kill_self();
  double red[2] = {local_loss, sq_norm(dev, ctx, p, layout, grads, comm_s, given_sq)};
  const double t0 = now_s();
  if (Communicator* c = dev.tp_comm(ctx, p))
    c->allreduce(&red[1], &red[1], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  if (replicas_loss_sum) {  // replicas: the islands' losses arrived with the gradients
    red[0] = *replicas_loss_sum;
  } else if (Communicator* c = dev.dp_comm(ctx, p)) {
    c->allreduce(&red[0], &red[0], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  }
  *comm_s += now_s() - t0;
  *loss_out = red[0] / (replicas_loss_sum ? dev.cfg().data_parallel() : p.dp);
  if (shared) {
    shared[0] = *loss_out;
    shared[1] = red[1];
  }
  const auto in = [&](size_t i) { return ctx.in<float>(i).data(); };
  // A non-finite loss or gradient norm: no update (the state passes through), as spmd_train.
  if (pwm::train::nonfinite_step(dev.cfg().hooks, step, loss_out, &red[1])) {
    for (size_t i : {kParams, kAdamM, kAdamV}) {
      auto out = ctx.out<float>(i);
      pass_through(out.data(), in(i), out.size());
    }
    return pwm::train::UpdateResult{model::lr_at(dev.cfg().optim, step), std::sqrt(red[1])};
  }
  return pwm::train::apply_update_into(dev.cfg(), layout, step, red[1], in(kParams), grads, in(kAdamM), in(kAdamV),
                                  ctx.out<float>(kParams).data(), ctx.out<float>(kAdamM).data(),
                                  ctx.out<float>(kAdamV).data());
}

// The fused kernels' trace, as spmd_train's (--trace): each backward unit's span on the kernel's
// row, each bucket's AllReduce on row 1. Empty hooks without a trace.
namespace {
collectives::BucketedAllreduce::OnBucketDone bucket_trace(TrainingDevice& dev) {
  Trace* t = dev.trace();
  if (t == nullptr) return {};
  return [t](int i, int64_t t0, int64_t t1, size_t bytes) {
    t->span(fmt::format("allreduce bucket {}", i), "comm", t0, t1, 1, fmt::format(R"({{"bytes":{}}})", bytes));
  };
}
}  // namespace
void trace_units(TrainingDevice& dev, pwm::train::StepHooks& hooks) {
  if (Trace* t = dev.trace()) hooks.span = [t](const char* name, int64_t t0, int64_t t1) { t->span(name, "compute", t0, t1); };
}

// The plan executed directly (pwm::train::accumulate_gradients, under `cfg`, reading data index
// `data_index`) into the device's layout-shaped gradient buffer, with the bucketed, overlapped dp
// AllReduce inside; returns the device's mean loss and adds the collectives' time to *comm_s.
double fused_gradients(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const pwm::train::TrainConfig& cfg,
                       int data_index, double* comm_s) {
  const ParamLayout& layout = dev.layout(p);
  const model::StepPlan& plan = dev.shapes().plan(p.tp);
  model::Workspace<float>& ws = dev.step_memory(layout);
  // With expert parallelism the experts' ranges are summed over the devices holding the same
  // experts only, the dense ranges around them over dp (spmd_train's two reducers).
  std::vector<collectives::BucketedAllreduce::Range> units = plan.finish_order();
  std::unique_ptr<collectives::BucketedAllreduce> experts;
  std::vector<int> expert_of;
  if (dev.cfg().mesh.ep > 1) {
    pwm::train::ExpertSplit split = pwm::train::split_experts(layout, units);
    units = split.dense;
    expert_of = split.expert_of;
    experts = std::make_unique<collectives::BucketedAllreduce>(dev.expert_comm(ctx, p), split.experts,
                                                               dev.cfg().exec.bucket_bytes, dev.cfg().exec.overlap,
                                                               bucket_trace(dev));
    experts->begin(dev.grads());
  }
  collectives::BucketedAllreduce reducer(dev.dp_comm(ctx, p), units, dev.cfg().exec.bucket_bytes,
                                         dev.cfg().exec.overlap, bucket_trace(dev));
  reducer.begin(dev.grads());
  pwm::train::StepHooks hooks;
  trace_units(dev, hooks);
  hooks.tp_reduce = dev.tp_reducer(dev.tp_comm(ctx, p), comm_s);
  hooks.unit_done = [&](int u) {
    reducer.unit_done(u);
    if (experts && expert_of[static_cast<size_t>(u)] >= 0) experts->unit_done(expert_of[static_cast<size_t>(u)]);
  };
  model::MoeStats moe;
  if (cfg.model.moe()) {
    hooks.ep = dev.expert_alltoall(ctx, p);
    hooks.moe = &moe;
  }
  const double local = pwm::train::accumulate_gradients(cfg, layout, plan, dev.data(), ctx.in<int64_t>(kStep)[0], data_index,
                                                   ctx.in<float>(kParams).data(), dev.grads(), ws, dev.tokens(), hooks);
  reducer.finish();
  *comm_s += reducer.comm_seconds();
  if (experts) {
    experts->finish();
    *comm_s += experts->comm_seconds();
  }
  dev.add_moe(moe);
  return local;
}

// The whole step: the plan executed directly (pwm::train::accumulate_gradients) into the device's
// layout-shaped gradient buffer, with the bucketed, overlapped dp AllReduce inside.
void fused_step(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  double comm_s = 0;
  if (dev.cfg().mesh.fsdp) {
    double loss = 0;
    const double local = fsdp_gradients(dev, ctx, p, step, p.dp_rank, dev.fsdp_grads(ctx, p), &comm_s);
    const pwm::train::UpdateResult u =
        shard_update(dev, ctx, p, step, dev.fsdp_grads(ctx, p), local, nullptr, &comm_s, &loss);
    ctx.out<int64_t>(kStep)[0] = step + 1;
    dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats));
    return;
  }
  const double local = fused_gradients(dev, ctx, p, dev.cfg(), p.dp_rank, &comm_s);
  double loss = 0;
  const pwm::train::UpdateResult u =
      finish_step(dev, ctx, p, layout, step, local, model::GradView(layout, dev.grads()), &comm_s, &loss);
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats));
}

}  // namespace pwm::programs::kernels
