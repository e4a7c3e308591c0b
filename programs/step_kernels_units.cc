// One kernel per unit kind of the step plan (chained, opbyop, and the pipeline's stages; attrs:
// tp, then the micro-batch or the layer): the batch, the forward and backward units, the dp
// reduction of a gradient piece (blocking, or started and finished as two nodes) and the update.
// Each calls the model functions train/step.cc's plan executor calls, on the same values: the
// same bits as spmd_train. The rest of the step kernels: step_kernels.cc (the fused step and the
// step's tail, finish_step), step_kernels_fsdp.cc, step_kernels_replicas.cc.
#include <cstring>

#include "collectives/bucketed_allreduce.h"
#include "common/time.h"
#include "model/optim.h"
#include "train/step.h"
#include "programs/kernels_impl.h"

namespace pwm::programs::kernels {

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

}  // namespace pwm::programs::kernels
