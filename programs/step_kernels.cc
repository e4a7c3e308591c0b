// The kernels of a training step on a dp x tp slice: the whole step in one kernel (fused), one
// kernel per unit kind of the step plan (chained, opbyop, and the pipeline's stages), the dp
// reduction of a gradient piece and the update. Every one calls the model functions the plan's
// executor in train/step.cc calls, on the same values, so all granularities compute the
// same bits as spmd_train.
#include <cmath>
#include <cstring>

#include "collectives/bucketed_allreduce.h"
#include "common/time.h"
#include "common/trace.h"
#include <fmt/format.h>
#include "model/optim.h"
#include "train/step.h"

#include <csignal>
#include "programs/kernels.h"

namespace pwm::programs::kernels {

using collectives::Algorithm;
using collectives::Communicator;
using collectives::ReduceOp;
using model::ParamLayout;

namespace {

Pos pos(const KernelContext& ctx) { return Pos::of(ctx, static_cast<int>(ctx.attr(0))); }  // attrs[0] = tp

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

// The global squared norm, the loss mean over dp, AdamW out of place: exactly spmd_train's tail.
// --expert-island: `given_sq` is this device's squared norm (sq_norm), and `shared` gets the
// loss and the squared norm the experts' devices' update needs (before the non-finite hook).
pwm::train::UpdateResult finish_step(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const ParamLayout& layout,
                                int64_t step, double local_loss, const model::GradView& grads, double* comm_s,
                                double* loss_out, const double* replicas_loss_sum = nullptr,
                                const double* given_sq = nullptr, double* shared = nullptr) {
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
      std::memcpy(out.data(), in(i), sizeof(float) * out.size());
    }
    return pwm::train::UpdateResult{model::lr_at(dev.cfg().optim, step), std::sqrt(red[1])};
  }
  return pwm::train::apply_update_into(dev.cfg(), layout, step, red[1], in(kParams), grads, in(kAdamM), in(kAdamV),
                                  ctx.out<float>(kParams).data(), ctx.out<float>(kAdamM).data(),
                                  ctx.out<float>(kAdamV).data());
}

// The fused kernels' trace, as spmd_train's (--trace): each backward unit's span on the kernel's
// row, each bucket's AllReduce on row 1. Empty hooks without a trace.
collectives::BucketedAllreduce::OnBucketDone bucket_trace(TrainingDevice& dev) {
  Trace* t = dev.trace();
  if (t == nullptr) return {};
  return [t](int i, int64_t t0, int64_t t1, size_t bytes) {
    t->span(fmt::format("allreduce bucket {}", i), "comm", t0, t1, 1, fmt::format(R"({{"bytes":{}}})", bytes));
  };
}
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

}  // namespace

namespace {

// --fsdp: the step on the dp shards, spmd_train's own (train/fsdp.h). The gradients: every layer
// gathered before its forward and its backward, its gradient reduce-scattered over the island's
// dp group into the device's gradient shard (dev.fsdp_grads()); reads data-parallel index
// `data_index`; returns the device's mean loss.
double fsdp_gradients(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int64_t step, int data_index,
                      double* comm_s) {
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  pwm::train::StepHooks hooks;
  trace_units(dev, hooks);
  hooks.tp_reduce = dev.tp_reducer(dev.tp_comm(ctx, p), comm_s);
  const double local = f.accumulate(dev.data(), step, data_index, ctx.in<float>(kParams).data(), dev.fsdp_grads(),
                                    dev.step_memory(dev.layout(p)), dev.tokens(), hooks);
  *comm_s += f.comm_seconds();
  return local;
}

// The update on the shards: the squared norm of the summed gradient shard `grads` summed over tp
// and dp, the loss (`loss_sum`: over every data-parallel device, or null: this device's
// `local_loss`, summed here over dp), AdamW on the shard written to the new state (the inputs
// copied, then updated in place: the same arithmetic per element as spmd_train's).
pwm::train::UpdateResult shard_update(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int64_t step,
                                     const float* grads, double local_loss, const double* loss_sum, double* comm_s,
                                     double* loss_out) {
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  // Testing hook: as finish_step's, after the gradients and before the update.
  if (dev.cfg().hooks.kill_now(step, ctx.world_rank())) dev.cfg().hooks.kill_self();
  double red[2] = {loss_sum ? *loss_sum : local_loss, f.grad_sq_norm(grads)};
  const double t0 = now_s();
  if (Communicator* c = dev.tp_comm(ctx, p))
    c->allreduce(&red[1], &red[1], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  Communicator* dp = dev.dp_comm(ctx, p);  // (--fsdp needs dp >= 2)
  dp->allreduce(&red[1], &red[1], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  if (!loss_sum)
    dp->allreduce(&red[0], &red[0], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  *comm_s += now_s() - t0;
  *loss_out = red[0] / dev.cfg().data_parallel();
  for (size_t i : {kParams, kAdamM, kAdamV}) {
    auto out = ctx.out<float>(i);
    std::memcpy(out.data(), ctx.in<float>(i).data(), sizeof(float) * out.size());
  }
  const bool skip = pwm::train::nonfinite_step(dev.cfg().hooks, step, loss_out, &red[1]);
  const pwm::train::UpdateResult u{model::lr_at(dev.cfg().optim, step), std::sqrt(red[1])};
  if (!skip)
    f.adamw(step, u.lr, model::clip_factor(dev.cfg().optim, red[1]), ctx.out<float>(kParams).data(), grads,
            ctx.out<float>(kAdamM).data(), ctx.out<float>(kAdamV).data());
  return u;
}

}  // namespace

// The whole step: the plan executed directly (pwm::train::accumulate_gradients) into the device's
// layout-shaped gradient buffer, with the bucketed, overlapped dp AllReduce inside.
void fused_step(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  double comm_s = 0;
  if (dev.cfg().mesh.fsdp) {
    double loss = 0;
    const double local = fsdp_gradients(dev, ctx, p, step, p.dp_rank, &comm_s);
    const pwm::train::UpdateResult u = shard_update(dev, ctx, p, step, dev.fsdp_grads(), local, nullptr, &comm_s, &loss);
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

// ---- One kernel per unit kind (attrs: tp, then the micro-batch or the layer) -------------------

void batch(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  const auto& cfg = dev.cfg();
  // Replicas: island r's dp rank d reads data-parallel index r x dp + d of replicas x dp (as
  // spmd_train's world rank does).
  const int64_t r = ctx.attrs().size() > ReplicaAttrs::kBatchReplica ? ctx.attr(ReplicaAttrs::kBatchReplica) : 0;
  const pwm::train::RowRange rows = pwm::train::batch_rows(cfg.workload.global_batch, static_cast<int>(r * p.dp + p.dp_rank),
                                                 p.dp * cfg.mesh.replicas, ctx.attr(1), cfg.workload.microbatches);
  dev.data().train_batch(cfg.workload.data_seed, ctx.in<int64_t>(0)[0], cfg.workload.global_batch, cfg.model.seq_len, rows.begin,
                         rows.end, ctx.out<int32_t>(0).data());
}

namespace {
// The weights a unit kernel reads (input 0): the state's parameters, or with --fsdp the gathered
// weights fsdp_gather made: layer `layer`'s array (indexed from its start minus the layer's
// offset), or (layer < 0) the embedding and final norm the device's Fsdp holds for the step
// (input 0 is then fsdp_gather's marker, which orders the gather before the kernel).
struct Weights {
  Weights(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int layer) {
    if (!dev.cfg().mesh.fsdp) {
      params = ctx.in<float>(0).data();
      return;
    }
    f = &dev.fsdp(ctx, p);
    params = layer >= 0 ? f->layer_base(layer, ctx.in<float>(0).data()) : f->tied_params();
  }
  const float* params = nullptr;
  pwm::train::Fsdp* f = nullptr;
};
}  // namespace

// inputs: params, tokens; output: x(0)
void embed_fwd(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const ParamLayout& layout = dev.layout(pos(ctx));
  dev.step_memory(layout);
  BoundActivations b(dev);
  b.act.bind_x(0, ctx.out<float>(0).data());
  const Weights w(dev, ctx, pos(ctx), -1);
  model::embed_forward<float>(layout, w.params, ctx.in<int32_t>(1).data(), b.act);
}

// inputs: params, x(l)[, with attrs[2] = 1 (--moe-routing controller) the counts the controller
// put for this device after reading moe_counts (Shapes::route_counts)]; outputs: x(l+1), saved(l)
// (the layer's activations). An MoE layer exchanges its rows over the expert-parallel group inside
// the kernel (block_fwd_ep, gang-scheduled) and keeps its routing with saved(l) for its backward.
void block_fwd(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const BlockUnit u(dev, ctx);
  const int l = u.layer;
  const bool moe = u.layout.layer(l).moe;
  BoundActivations b(dev);
  double comm_s = 0;
  b.act.bind_x(l, const_cast<float*>(ctx.in<float>(1).data()));  // read only: block_forward reads x(l)
  b.act.bind_x(l + 1, ctx.out<float>(0).data());
  b.act.bind_layer(l, ctx.out<float>(1).data());
  const bool routed = ctx.attrs().size() > 2 && ctx.attr(2) != 0;
  if (routed) dev.routed(scope);
  const model::ExpertComm<float> ep =
      moe ? dev.expert_alltoall(ctx, u.p, routed ? ctx.in<int64_t>(2) : std::span<const int64_t>{}) : model::ExpertComm<float>{};
  const Weights w(dev, ctx, u.p, l);
  model::block_forward<float>(u.layout, w.params, l, b.act, u.ws.scratch, dev.tp_reducer(dev.tp_comm(ctx, u.p), &comm_s),
                              ep);
  dev.add_comm(comm_s);
  if (moe) {
    dev.add_moe(b.act.moe(l).stats);
    dev.keep_moe(ctx.out<float>(1).data(), b.act.moe(l));
  }
}

// inputs: params, x(l) of an MoE layer; output: this device's rows per expert ([E], int64), the
// counts the controller reads before it dispatches the layer's block_fwd (--moe-routing
// controller). The layer's norm and router only: the same bits as block_fwd computes them.
void moe_counts(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const BlockUnit u(dev, ctx);
  BoundActivations b(dev);
  b.act.bind_x(u.layer, const_cast<float*>(ctx.in<float>(1).data()));
  const std::vector<int64_t> rows = model::block_expert_rows<float>(u.layout, ctx.in<float>(0).data(), u.layer, b.act,
                                                                    u.ws.scratch);
  auto out = ctx.out<int64_t>(0);
  PWM_CHECK_EQ(out.size(), rows.size());
  std::copy(rows.begin(), rows.end(), out.begin());
}

// The tied piece holds embed then final_norm (the plan's ranges back to back): head_backward
// accumulates into it directly, after the previous micro-batch's sums are copied in (or zeros).
void head(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  auto& ws = dev.step_memory(layout);
  BoundActivations b(dev);
  const int L = static_cast<int>(dev.cfg().model.n_layers);
  const float grad_scale = 1.0f / static_cast<float>(dev.cfg().workload.microbatches * p.dp * dev.cfg().mesh.replicas);
  b.act.bind_x(L, const_cast<float*>(ctx.in<float>(kHeadX).data()));
  b.act.bind_dx(ctx.out<float>(kHeadDx).data());
  const int32_t* tokens = ctx.in<int32_t>(kHeadTokens).data();
  const Weights w(dev, ctx, p, -1);
  const float* params = w.params;
  ctx.out<double>(kHeadLoss)[0] = model::head_forward<float>(layout, params, tokens, b.act);
  auto tied = ctx.out<float>(kHeadTied);
  if (ctx.num_inputs() > kHeadTiedPrev)
    std::memcpy(tied.data(), ctx.in<float>(kHeadTiedPrev).data(), sizeof(float) * tied.size());
  else
    std::fill(tied.begin(), tied.end(), 0.0f);
  const auto& ranges = dev.shapes().plan(p.tp).piece_ranges(model::StepPlan::kTiedPiece);
  PWM_CHECK(ranges.size() == 2 && ranges[0].first == layout.embed_offset() &&
                ranges[1].first == layout.final_norm_offset(),
            "the tied piece is embed then final_norm");
  const int64_t embed_n = ranges[0].second - ranges[0].first;
  model::head_backward<float>(layout, params, model::HeadGrads<float>{tied.data(), tied.data() + embed_n}, tokens,
                              grad_scale, b.act, ws.scratch);
}

// The layer's piece is a view of the layout-shaped buffer at the layer's offset: block_backward
// accumulates into the output directly.
void block_bwd(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const BlockUnit u(dev, ctx);
  const int l = u.layer;
  BoundActivations b(dev);
  double comm_s = 0;
  b.act.bind_layer(l, const_cast<float*>(ctx.in<float>(kBwdSaved).data()));
  b.act.bind_x(l, const_cast<float*>(ctx.in<float>(kBwdX).data()));
  float* dx = ctx.out<float>(kBwdDxOut).data();
  std::memcpy(dx, ctx.in<float>(kBwdDx).data(), sizeof(float) * dev.shapes().act());  // turned into d/dx(l) in place
  b.act.bind_dx(dx);
  auto g = ctx.out<float>(kBwdGrad);
  const bool acc = ctx.num_inputs() > kBwdGradPrev;
  if (dev.cfg().mesh.fsdp) {  // the micro-batch's full layer gradient (fsdp_rs_* cut it)
    PWM_CHECK(!acc, "--fsdp: block_bwd takes no gradient so far (fsdp_rs_finish adds the chunks)");
    const Weights w(dev, ctx, u.p, l);
    std::fill(g.begin(), g.end(), 0.0f);  // the padding too: the reduce-scatter reads it
    model::block_backward<float>(u.layout, w.params, w.f->layer_base(l, g.data()), l, b.act, u.ws.scratch,
                                 dev.tp_reducer(dev.tp_comm(ctx, u.p), &comm_s));
    dev.add_comm(comm_s);
    return;
  }
  if (acc)
    std::memcpy(g.data(), ctx.in<float>(kBwdGradPrev).data(), sizeof(float) * g.size());
  else
    std::fill(g.begin(), g.end(), 0.0f);
  const bool moe = u.layout.layer(l).moe;
  if (moe) dev.take_moe(ctx.in<float>(kBwdSaved).data(), b.act.moe(l));
  const model::ExpertComm<float> ep = moe ? dev.expert_alltoall(ctx, u.p) : model::ExpertComm<float>{};
  model::block_backward<float>(u.layout, ctx.in<float>(kBwdParams).data(), g.data() - u.layout.layer(l).begin, l, b.act,
                               u.ws.scratch, dev.tp_reducer(dev.tp_comm(ctx, u.p), &comm_s), ep);
  dev.add_comm(comm_s);
}

// The tied piece plus the lookup's part of the embedding gradient (the piece starts with embed,
// which starts the layout: a view at offset 0).
void embed_bwd(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const ParamLayout& layout = dev.layout(pos(ctx));
  dev.step_memory(layout);
  BoundActivations b(dev);
  b.act.bind_dx(const_cast<float*>(ctx.in<float>(kEBwdDx).data()));
  auto out = ctx.out<float>(0);
  std::memcpy(out.data(), ctx.in<float>(kEBwdTied).data(), sizeof(float) * out.size());
  model::embed_backward<float>(layout, out.data() - layout.embed_offset(), ctx.in<int32_t>(kEBwdTokens).data(), b.act);
  dev.backward_done(scope);  // the last micro-batch's is the step's last backward unit
}

namespace {
// out = the sum of in over `c` (a copy for a group of one).
void sum_over(TrainingDevice& dev, Communicator* c, const float* in, float* out, size_t n) {
  if (n == 0) return;
  if (c == nullptr) {
    std::memcpy(out, in, sizeof(float) * n);
    return;
  }
  const double t0 = now_s();
  c->allreduce(in, out, n, collectives::DataType::kFloat32, ReduceOp::kSum);
  dev.add_comm(now_s() - t0);
}
}  // namespace

namespace {
// Piece `piece` of the step plan summed as spmd_train sums those elements (chained and opbyop,
// whose pieces are the layers, against spmd_train's and the fused kernel's buckets: a bucket
// sized from the model holds parts of two layers, the tied piece's two ranges lie at the two ends
// of the buffer). With two summands every way gives the same bits (a + b == b + a). From three
// on the ring sums an element in an order fixed by its chunk of the vector it reduces (c+1, c+2,
// ..., c), and the cost model picks the algorithm by that vector's size: the piece reduced as one
// vector summed most elements in another order than spmd_train's bucket (dp 3: max |dloss|
// 8e-8, other weights). So each part of the piece that lies in one of spmd_train's buckets is
// reduced as that window of the bucket (BucketedAllreduce::parts, iallreduce_window): the
// bucket's algorithm and, for the ring, its chunks, so every element gets the bucket's bits. The
// buckets: BucketedAllreduce::cut of the plan's finish order under --bucket-bytes; with expert
// parallelism the dense ranges over dp and the experts' over the expert group, each cut on its
// own (spmd_train's two reducers). Groups of one copy; groups of two reduce the piece's
// adjacent parts in one call, as a piece was reduced before (no extra messages at dp 2).
void sum_as_buckets(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int piece, const float* in, float* out,
                    size_t n) {
  const TrainingDevice::PieceParts& pp = dev.piece_parts(p, piece);
  const double t0 = now_s();
  std::vector<collectives::Work> works;
  size_t covered = 0;
  for (const bool over_experts : {false, true}) {
    const auto& parts = over_experts ? pp.experts : pp.dense;
    if (parts.empty()) continue;
    Communicator* c = over_experts ? dev.expert_comm(ctx, p) : dev.dp_comm(ctx, p);
    for (size_t i = 0; i < parts.size();) {
      size_t j = i + 1, count = static_cast<size_t>(parts[i].count);
      if (c == nullptr || c->size() <= 2)
        for (; j < parts.size() && parts[j].at == parts[j - 1].at + parts[j - 1].count; ++j)
          count += static_cast<size_t>(parts[j].count);
      const size_t at = static_cast<size_t>(parts[i].at);
      PWM_CHECK(at + count <= n, "dp_allreduce: piece {} part [{}, {}) outside its {} elements", piece, at, at + count,
                n);
      if (c == nullptr) {
        std::memcpy(out + at, in + at, sizeof(float) * count);
      } else if (c->size() <= 2) {
        works.push_back(c->iallreduce(in + at, out + at, count, collectives::DataType::kFloat32, ReduceOp::kSum));
      } else {
        const Communicator::Window w{static_cast<size_t>(parts[i].bucket_elems), static_cast<size_t>(parts[i].offset)};
        works.push_back(
            c->iallreduce_window(in + at, out + at, count, collectives::DataType::kFloat32, ReduceOp::kSum, w));
      }
      covered += count;
      i = j;
    }
  }
  PWM_CHECK_EQ(covered, n);  // the buckets cover every element of the piece once
  for (collectives::Work& w : works) w.wait();
  if (!works.empty()) dev.add_comm(now_s() - t0);
}
}  // namespace

// attrs: tp, size[, dense[, piece]]: with expert parallelism an MoE layer's piece is its dense
// part (`dense` elements, summed over dp) then its local experts (summed over the devices holding
// the same experts), as spmd_train's two reducers. With `piece` (the step plan's piece index:
// chained and opbyop) every element is summed as spmd_train's buckets sum it (sum_as_buckets);
// without (the pipeline's stages, the replicas' islands) the piece is one vector.
void dp_allreduce(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto in = ctx.in<float>(0);
  auto out = ctx.out<float>(0);
  const Pos p = pos(ctx);
  if (ctx.attrs().size() > 3) {
    sum_as_buckets(dev, ctx, p, static_cast<int>(ctx.attr(3)), in.data(), out.data(), in.size());
    return;
  }
  const size_t dense = ctx.attrs().size() > 2 ? static_cast<size_t>(ctx.attr(2)) : in.size();
  sum_over(dev, dev.dp_comm(ctx, p), in.data(), out.data(), dense);
  if (dense < in.size()) sum_over(dev, dev.expert_comm(ctx, p), in.data() + dense, out.data() + dense, in.size() - dense);
}

// The same sum, started here and finished by dp_reduce_finish (attrs: tp, size, layer): inputs
// the piece; output the buffer the sum lands in, complete only when dp_reduce_finish has run
// (only that node reads it). The same AllReduce as dp_allreduce (the same algorithm for the same
// size), so the same bits.
void dp_reduce_start(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  dev.start_reduce(ctx, pos(ctx), ctx.in<float>(0), ctx.out<float>(0), static_cast<int>(ctx.attr(2)));
}

// inputs: the piece and dp_reduce_start's output (the piece is an input only to keep it alive
// while the AllReduce reads it); output: the sum.
void dp_reduce_finish(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto sum = ctx.in<float>(1);
  dev.finish_reduce(sum.data());
  std::memcpy(ctx.out<float>(0).data(), sum.data(), sizeof(float) * sum.size());
}

// --expert-island: the device's squared gradient norm as spmd_train's rank computes it, from the
// dense gradients here and each experts' device's per-parameter squared norms (expert_sqnorm, in
// layout order): with P = 1 one sum over the layout in order (the experts' terms where they fall),
// with P > 1 the dense part plus the experts' devices' sums added as its AllReduce adds them.
double island_sq_norm(const ParamLayout& layout, const model::GradView& grads, const std::vector<std::span<const double>>& e) {
  if (e.size() == 1) {
    double total = 0.0;
    size_t i = 0;
    for (const model::ParamInfo& q : layout.params())
      total += q.expert ? e[0][i++] : model::sq_norm(grads.at(q.offset, q.size), static_cast<size_t>(q.size));
    return total;
  }
  std::vector<double> sums;
  for (const auto& v : e) {
    double t = 0.0;
    for (double x : v) t += x;
    sums.push_back(t);
  }
  return model::grad_sq_norm_tp(layout, grads, model::NormPart::kDense) + collectives::recursive_doubling_sum(sums);
}

// inputs: update_args(); the pieces are read where they are (model::GradView), not assembled.
// --expert-island (attrs[1] = 1): then each experts' device's squared norms (expert_sqnorm); one
// more output, the loss and the squared norm for the experts' devices' update.
void update(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  const model::StepPlan& plan = dev.shapes().plan(p.tp);
  const UpdateArgs args = update_args(dev.shapes(), p.tp);
  const bool island = ctx.attrs().size() > 1 && ctx.attr(1) != 0;
  std::vector<std::span<const double>> experts;
  for (size_t j = args.count(); island && j < ctx.num_inputs(); ++j) experts.push_back(ctx.in<double>(j));
  PWM_CHECK_EQ(ctx.num_inputs(), args.count() + experts.size());
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  model::GradView grads;
  for (int i = 0; i < plan.num_pieces(); ++i) grads.add(plan.piece_ranges(i), ctx.in<float>(args.piece(i)).data());
  const double given_sq = island ? island_sq_norm(layout, grads, experts) : 0.0;
  double local = 0;
  for (size_t m = 0; m < args.losses; ++m) local += ctx.in<double>(args.loss(m))[0];
  local /= static_cast<double>(args.losses);
  double comm_s = 0, loss = 0;
  double* shared = island ? ctx.out<double>(StepOutputs<int>::kCount).data() : nullptr;
  const pwm::train::UpdateResult u =
      finish_step(dev, ctx, p, layout, step, local, grads, &comm_s, &loss, nullptr, island ? &given_sq : nullptr, shared);
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats));
}

// --fsdp (chained; attrs: tp): the tied piece (embed then final_norm, summed over the
// micro-batches) reduce-scattered into the embedding's and the final norm's chunks.
void tied_reduce_scatter(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  const int64_t embed_n = layout.get("embed").size;
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  const float* tied = ctx.in<float>(0).data();
  f.reduce_tied_grads(tied, tied + embed_n, ctx.out<float>(0).data(), ctx.out<float>(1).data());
  f.release_tied_params();  // the step's last reader was its last head
  dev.add_comm(f.comm_seconds());
}

// --fsdp (chained, opbyop; attrs: tp, layer or -1): input the parameters' shard; output layer
// l's weights gathered over dp, or for -1 a marker (1): the embedding and final norm are gathered
// into the device's Fsdp, held until tied_reduce_scatter (as spmd_train holds them for the step:
// the model reads them where the full layout has them, which one array of their own is not).
void fsdp_gather(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  const int l = static_cast<int>(ctx.attr(1));
  const float* shard = ctx.in<float>(0).data();
  if (l < 0) {
    f.gather_tied_params(shard);
    ctx.out<int64_t>(0)[0] = 1;
  } else {
    f.gather_layer(l, shard, ctx.out<float>(0).data());
  }
  dev.add_comm(f.comm_seconds());
}

namespace {
// The chunk so far (attrs[2] = 1: the last input) plus this micro-batch's, as Fsdp::accumulate
// adds into the shard; the first micro-batch's is copied.
void add_chunk(KernelContext& ctx, std::span<const float> sum) {
  auto out = ctx.out<float>(0);
  PWM_CHECK_EQ(out.size(), sum.size());
  if (ctx.attrs().size() > 2 && ctx.attr(2) != 0) {
    auto prev = ctx.in<float>(ctx.num_inputs() - 1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = prev[i] + sum[i];
  } else if (out.data() != sum.data()) {
    std::memcpy(out.data(), sum.data(), sizeof(float) * out.size());
  }
}
}  // namespace

// --fsdp (attrs: tp, layer): input the layer's full gradient; output the buffer its chunk lands
// in, complete when fsdp_rs_finish has run (its only reader). The same reduce-scatter as
// spmd_train's (Fsdp::start_reduce_layer): the same bits.
void fsdp_rs_start(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  dev.start_layer_reduce_scatter(ctx, pos(ctx), static_cast<int>(ctx.attr(1)), ctx.in<float>(0).data(),
                                 ctx.out<float>(0).data());
}

// inputs: the gradient (kept alive while the reduce-scatter reads it), the started buffer[, the
// chunk so far]; output: the chunk.
void fsdp_rs_finish(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto started = ctx.in<float>(1);
  dev.finish_reduce(started.data());
  add_chunk(ctx, started);
}

// The blocking form (--no-overlap): inputs the gradient[, the chunk so far]; output the chunk.
void fsdp_reduce_scatter(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  auto out = ctx.out<float>(0);
  const bool prev = ctx.attrs().size() > 2 && ctx.attr(2) != 0;
  std::vector<float> tmp(prev ? out.size() : 0);  // (the first micro-batch's lands in the output)
  float* sum = prev ? tmp.data() : out.data();
  const int64_t t0 = now_us();
  collectives::Work w = dev.fsdp(ctx, p).start_reduce_layer(static_cast<int>(ctx.attr(1)), ctx.in<float>(0).data(), sum);
  w.wait();
  dev.add_comm((now_us() - t0) * 1e-6);
  add_chunk(ctx, {sum, out.size()});
}

// --fsdp (chained; attrs: tp): inputs the state (shards), the gradient's chunks in shard order
// (embedding, layers, final norm), the micro-batch losses; the update on the shard.
void sharded_update(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  constexpr size_t kArgs = kStep + 1;  // the state's arrays
  const size_t chunks = static_cast<size_t>(dev.cfg().model.n_layers) + 2, M = ctx.num_inputs() - kArgs - chunks;
  float* g = dev.fsdp_grads();
  for (size_t i = 0; i < chunks; ++i) {
    auto c = ctx.in<float>(kArgs + i);
    g = std::copy(c.begin(), c.end(), g);
  }
  PWM_CHECK_EQ(g - dev.fsdp_grads(), dev.fsdp(ctx, p).shard_total());
  double local = 0;
  for (size_t m = 0; m < M; ++m) local += ctx.in<double>(kArgs + chunks + m)[0];
  local /= static_cast<double>(M);
  double comm_s = 0, loss = 0;
  const pwm::train::UpdateResult u = shard_update(dev, ctx, p, step, dev.fsdp_grads(), local, nullptr, &comm_s, &loss);
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats));
}

// ---- Replicas: one slice per island, the cross-island exchange as program nodes ----------------
//
// Each island runs its own step on its slice; a gradient piece reduced inside the island goes to
// the peer device (same shard index) of every other island as a runtime transfer, and
// replica_add on each island sums the islands' pieces in island order, so every island holds
// the same bits and applies the same update (docs/pathways_train.md, "Replicas").

// The whole island step (attrs: tp, replica, shards): the plan into the device's gradient buffer
// with the bucketed dp AllReduce inside the island, as fused_step; outputs the plan's pieces
// (copies out of the buffer, for the exchange) and the island's loss (the dp sum of the local
// means). shards = dp > 1: each piece's chunk of this device's dp rank only (replica_chunk), the
// 1/dp share it exchanges with its peers; the buffer already holds the whole sum, so the chunk
// has the bits the whole piece has.
void fused_grads(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const model::StepPlan& plan = dev.shapes().plan(p.tp);
  const int replica = static_cast<int>(ctx.attr(ReplicaAttrs::kFusedReplica));
  double comm_s = 0;
  // The flat view: dp = replicas x dp, this device's data index replica x dp + dp rank.
  double loss = fused_gradients(dev, ctx, p, dev.flat_cfg(), replica * p.dp + p.dp_rank, &comm_s);
  if (Communicator* c = dev.dp_comm(ctx, p)) {
    const double t0 = now_s();
    c->allreduce(&loss, &loss, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
    comm_s += now_s() - t0;
  }
  dev.add_comm(comm_s);
  const int shards = static_cast<int>(ctx.attr(ReplicaAttrs::kFusedShards));
  std::vector<float> whole;
  for (int i = 0; i < plan.num_pieces(); ++i) {
    auto o = ctx.out<float>(static_cast<size_t>(i));
    float* out = o.data();
    if (shards > 1) {
      whole.resize(static_cast<size_t>(dev.shapes().piece(p.tp, i)));
      out = whole.data();
    }
    for (const auto& [b, e] : plan.piece_ranges(i)) {
      std::memcpy(out, dev.grads() + b, sizeof(float) * static_cast<size_t>(e - b));
      out += e - b;
    }
    if (shards > 1) copy_chunk(whole, p.dp_rank, o);
  }
  ctx.out<double>(static_cast<size_t>(plan.num_pieces()))[0] = loss;
  dev.backward_done(scope);
}

// This island's sum of one piece over its dp group, of which this device keeps chunk k = its dp
// rank (attrs: tp, size, dp): a ReduceScatter of the piece zero-padded to dp x replica_chunk
// elements. Replaces dp_allreduce when the islands exchange 1/dp of each piece (dp_allgather
// makes it whole after the exchange): at dp = 2 each element is a + b, the bits of the
// AllReduce and of spmd_train's hierarchical ReduceScatter.
void dp_reduce_scatter(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto in = ctx.in<float>(0);
  auto out = ctx.out<float>(0);
  Communicator* c = dev.dp_comm(ctx, pos(ctx));
  PWM_CHECK(c != nullptr && out.size() == replica_chunk(static_cast<int64_t>(in.size()), c->size()),
            "dp_reduce_scatter: {} elements into chunks of {}", in.size(), out.size());
  std::vector<float> padded(out.size() * static_cast<size_t>(c->size()), 0.0f);
  std::memcpy(padded.data(), in.data(), sizeof(float) * in.size());
  const double t0 = now_s();
  c->reduce_scatter(padded.data(), out.data(), out.size(), collectives::DataType::kFloat32, ReduceOp::kSum);
  dev.add_comm(now_s() - t0);
}

// The whole piece again from the dp group's chunks (attrs: tp, size, dp): an AllGather, the padding
// dropped. No arithmetic: every device ends with the same bits.
void dp_allgather(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto in = ctx.in<float>(0);
  auto out = ctx.out<float>(0);
  Communicator* c = dev.dp_comm(ctx, pos(ctx));
  PWM_CHECK(c != nullptr && in.size() == replica_chunk(static_cast<int64_t>(out.size()), c->size()),
            "dp_allgather: chunks of {} into {} elements", in.size(), out.size());
  std::vector<float> all(in.size() * static_cast<size_t>(c->size()));
  const double t0 = now_s();
  c->allgather(in.data(), all.data(), in.size(), collectives::DataType::kFloat32);
  dev.add_comm(now_s() - t0);
  std::memcpy(out.data(), all.data(), sizeof(float) * out.size());
}

// --fsdp: the whole island step on the shards (attrs: tp, replica): the device's gradient shard
// summed over the island's dp group (Fsdp's reduce-scatters; the flat view's data index and
// scale, as fused_grads), which is what it exchanges with its peers, and the island's loss.
void shard_grads(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const int replica = static_cast<int>(ctx.attr(ReplicaAttrs::kFusedReplica));
  double comm_s = 0;
  double loss = fsdp_gradients(dev, ctx, p, ctx.in<int64_t>(kStep)[0], replica * p.dp + p.dp_rank, &comm_s);
  const double t0 = now_s();
  dev.dp_comm(ctx, p)->allreduce(&loss, &loss, 1, collectives::DataType::kFloat64, ReduceOp::kSum,
                                 Algorithm::kRecursiveDoubling);
  dev.add_comm(comm_s + now_s() - t0);
  auto out = ctx.out<float>(0);
  std::memcpy(out.data(), dev.fsdp_grads(), sizeof(float) * out.size());
  ctx.out<double>(1)[0] = loss;
  dev.backward_done(scope);
}

// The island's loss (chained; attrs: tp, micro-batches): the dp sum of the local means.
void island_loss(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  double local = 0;
  for (size_t m = 0; m < ctx.num_inputs(); ++m) local += ctx.in<double>(m)[0];
  local /= static_cast<double>(ctx.num_inputs());
  if (Communicator* c = dev.dp_comm(ctx, pos(ctx))) {
    const double t0 = now_s();
    c->allreduce(&local, &local, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
    dev.add_comm(now_s() - t0);
  }
  ctx.out<double>(0)[0] = local;
}

// The islands' copies of one piece, summed in island order (attrs: tp, size, replicas): every
// island adds the same inputs in the same order, so all hold the same bits. With two islands
// the sum is a + b, SPMD's two-rank AllReduce, bit for bit.
void replica_add(TrainingDevice&, KernelContext& ctx, Scope&) {
  auto o = ctx.out<float>(0);
  auto a = ctx.in<float>(0);
  std::memcpy(o.data(), a.data(), sizeof(float) * o.size());
  for (size_t r = 1; r < ctx.num_inputs(); ++r) {
    auto b = ctx.in<float>(r);
    for (size_t i = 0; i < o.size(); ++i) o[i] += b[i];
  }
}

// inputs: replica_update_args(): the state, the summed pieces (--fsdp: the summed gradient
// shard, or with attrs[1] = 1 its chunks), each island's loss.
void replica_update(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  StepStats xchg;  // the exchange's timing (StepStats' three exchange words)
  xchg.xchg_exposed_ms = dev.exchange_exposed_s() * 1e3;
  xchg.bwd_end_us = dev.backward_end_ctrl_us();
  xchg.update_start_us = dev.now_ctrl_us();
  const Pos p = pos(ctx);
  if (dev.cfg().mesh.fsdp) {
    const UpdateArgs args = replica_update_args(dev.shapes(), p.tp, ctx.attrs().size() > 1 && ctx.attr(1) != 0);
    PWM_CHECK_EQ(ctx.num_inputs(), args.count());
    const int64_t step = ctx.in<int64_t>(kStep)[0];
    double total = 0;  // island order, as the gradients
    for (size_t r = 0; r < args.losses; ++r) total += ctx.in<double>(args.loss(r))[0];
    const float* g = ctx.in<float>(args.piece(0)).data();
    if (args.pieces > 1) {  // the chunks, in shard order, into the device's gradient shard
      float* to = dev.fsdp_grads();
      for (size_t i = 0; i < args.pieces; ++i) {
        auto c = ctx.in<float>(args.piece(i));
        to = std::copy(c.begin(), c.end(), to);
      }
      PWM_CHECK_EQ(to - dev.fsdp_grads(), dev.fsdp(ctx, p).shard_total());
      g = dev.fsdp_grads();
    }
    double comm_s = 0, loss = 0;
    const pwm::train::UpdateResult u = shard_update(dev, ctx, p, step, g, 0.0, &total, &comm_s, &loss);
    ctx.out<int64_t>(kStep)[0] = step + 1;
    dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats), &xchg);
    return;
  }
  const ParamLayout& layout = dev.layout(p);
  const model::StepPlan& plan = dev.shapes().plan(p.tp);
  const UpdateArgs args = replica_update_args(dev.shapes(), p.tp);
  PWM_CHECK_EQ(ctx.num_inputs(), args.count());
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  model::GradView grads;
  for (int i = 0; i < plan.num_pieces(); ++i) grads.add(plan.piece_ranges(i), ctx.in<float>(args.piece(i)).data());
  double total = 0;  // island order, as the gradients
  for (size_t r = 0; r < args.losses; ++r) total += ctx.in<double>(args.loss(r))[0];
  double comm_s = 0, loss = 0;
  const pwm::train::UpdateResult u = finish_step(dev, ctx, p, layout, step, 0.0, grads, &comm_s, &loss, &total);
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats), &xchg);
}

}  // namespace pwm::programs::kernels
