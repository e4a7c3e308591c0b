// --expert-island's kernels (Shapes::expert_island, docs/pathways_train_moe.md "Experts on an island
// of their own"): an MoE layer's block in three nodes, the dense slice's around the experts'.
//
//   dense slice (D devices)                 experts' device j (a slice of one, for j < P = D)
//   moe_send(l): the block, the router,  -> expert_fwd(l, j): the rows of every dense device
//     the rows for each experts' device        through expert-parallel rank j's experts
//   moe_combine(l): x(l+1) += the gated  <-
//     outputs
//   moe_bwd_send(l): the combine's       -> expert_bwd(l, j): the experts' backward, their
//     backward, the rows' gradients            gradient piece, the rows' input gradients
//   block_bwd (remote): the block's      <-
//     backward with those gradients
//
// A block crosses as one edge per (dense device, experts' device): output j of the dense node is
// split over the D devices (device k's block for device j), the experts' node on slice j takes it
// whole (replicated): the lowering sends each device's block to device j, and back the same way.
// The arithmetic is model/moe.h's remote-expert steps, the same products in the same order as
// spmd_train's AllToAll path with P = D: the same bits.
//
// The experts' device keeps a layer's expert state (its rows, the SwiGLU inputs) from expert_fwd
// to expert_bwd under the output's buffer (keep_moe/take_moe, as a block keeps its routing under
// saved(l)); expert_bwd takes that output as an input, which also keeps it alive until then.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "collectives/communicator.h"
#include "model/optim.h"
#include "programs/kernels.h"
#include "train/step.h"

namespace pwm::programs::kernels {

using model::ParamLayout;

namespace {

template <typename V>
void grow(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// What an experts' device's kernel (attrs: tp, layer, j) works with: expert-parallel rank j's
// layout (the state the device holds is that rank's), the workspace's MoE slot of the layer.
struct ExpertUnit {
  ExpertUnit(TrainingDevice& dev, const KernelContext& ctx)
      : layer(static_cast<int>(ctx.attr(1))), j(static_cast<int>(ctx.attr(2))),
        p{dev.cfg().mesh.dp, 1, j, 0}, layout(dev.layout(p)), ws(dev.step_memory(layout)), D(dev.cfg().mesh.dp),
        El(layout.local_experts()), C(dev.cfg().model.d_model), rows(dev.shapes().island_rows()) {}
  int layer, j;
  Pos p;
  const ParamLayout& layout;
  model::Workspace<float>& ws;
  int64_t D, El, C, rows;
  model::MoeState<float>& st() { return ws.act.moe(layer); }
  // Rows of source device k's block (its counts summed).
  int64_t block(int64_t k) const {
    int64_t n = 0;
    for (int64_t e = 0; e < El; ++e) n += ws.act.moe(layer).block_rows[static_cast<size_t>(k * El + e)];
    return n;
  }
  // The blocks (D of `rows` rows each, the used rows first) <-> the rows back to back.
  void compact(const float* blocks, float* out) const {
    for (int64_t k = 0, r0 = 0; k < D; r0 += block(k), ++k)
      std::memcpy(out + r0 * C, blocks + k * rows * C, sizeof(float) * block(k) * C);
  }
  // ... and output `out`'s blocks declared used up to their rows (each goes back to its dense
  // device with those rows only).
  void spread(const float* in, KernelContext& ctx, size_t out) const {
    std::span<float> blocks = ctx.out<float>(out);
    std::fill(blocks.begin(), blocks.end(), 0.0f);
    std::vector<uint64_t> used;
    for (int64_t k = 0, r0 = 0; k < D; r0 += block(k), ++k) {
      std::memcpy(blocks.data() + k * rows * C, in + r0 * C, sizeof(float) * block(k) * C);
      used.push_back(sizeof(float) * static_cast<uint64_t>(block(k) * C));
    }
    ctx.set_used(out, sizeof(float) * static_cast<uint64_t>(rows * C), std::move(used));
  }
};

// The dense device's side: its rows for experts' device j are rows [first, first + send_rows[j])
// of the dispatched buffer (expert-major, so device-major).
int64_t first_row(const model::MoeState<float>& st, int j) {
  int64_t r = 0;
  for (int q = 0; q < j; ++q) r += st.send_rows[static_cast<size_t>(q)];
  return r;
}

// The dispatched buffer's rows (C wide) from the experts' blocks, inputs first..first+P-1.
void gather_blocks(KernelContext& ctx, size_t first, const model::MoeState<float>& st, int64_t C, std::vector<float>& out) {
  const int P = static_cast<int>(st.send_rows.size());
  grow(out, static_cast<size_t>((first_row(st, P)) * C));
  for (int j = 0; j < P; ++j)
    std::memcpy(out.data() + first_row(st, j) * C, ctx.in<float>(first + static_cast<size_t>(j)).data(),
                sizeof(float) * st.send_rows[static_cast<size_t>(j)] * C);
}

}  // namespace

// inputs: params, x(l); outputs: x(l+1) without the MoE branch, saved(l), the block of rows for
// each experts' device (Shapes::island_block), then each one's counts (island_counts). attrs:
// tp, layer, micro-batch.
void moe_send(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const BlockUnit u(dev, ctx);
  const int l = u.layer, P = dev.cfg().mesh.ep;
  const int64_t C = dev.cfg().model.d_model, El = u.layout.local_experts(), rows = dev.shapes().island_rows();
  BoundActivations b(dev);
  b.act.bind_x(l, const_cast<float*>(ctx.in<float>(1).data()));
  b.act.bind_x(l + 1, ctx.out<float>(0).data());
  b.act.bind_layer(l, ctx.out<float>(1).data());
  model::ExpertComm<float> ep;
  ep.size = P;
  ep.at = model::ExpertsAt::kRemote;
  model::block_forward<float>(u.layout, ctx.in<float>(0).data(), l, b.act, u.ws.scratch, {}, ep);
  model::MoeState<float>& st = b.act.moe(l);
  for (int j = 0; j < P; ++j) {
    const int64_t n = st.send_rows[static_cast<size_t>(j)];
    PWM_CHECK(n <= rows, "moe_send: {} rows for experts' device {}, the block holds {}", n, j, rows);
    auto out = ctx.out<float>(2 + static_cast<size_t>(j));
    std::memcpy(out.data(), u.ws.scratch.moe.sent.data() + first_row(st, j) * C, sizeof(float) * n * C);
    std::fill(out.begin() + n * C, out.end(), 0.0f);
    ctx.set_used(2 + static_cast<size_t>(j), sizeof(float) * out.size(), {sizeof(float) * static_cast<uint64_t>(n * C)});
    auto counts = ctx.out<int64_t>(2 + static_cast<size_t>(P + j));
    for (int64_t e = 0; e < El; ++e) counts[static_cast<size_t>(e)] = st.expert_rows[static_cast<size_t>(j * El + e)];
  }
  // The rows this device sends, padding included: summed over the slice, the rows the experts
  // compute (what a device holding experts counts under spmd_train).
  st.stats.expert_rows = first_row(st, P);
  dev.add_moe(st.stats, ctx.attr(2) * dev.cfg().model.n_layers + l);
  dev.keep_moe(ctx.out<float>(1).data(), st);
}

// inputs: params (expert-parallel rank j's), the dense devices' blocks, their counts; output the
// experts' outputs in the same blocks.
void expert_fwd(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  ExpertUnit e(dev, ctx);
  model::MoeState<float>& st = e.st();
  auto counts = ctx.in<int64_t>(2);
  st.block_rows.assign(counts.begin(), counts.end());
  int64_t R = 0;
  for (int64_t k = 0; k < e.D; ++k) R += e.block(k);
  grow(st.xe, static_cast<size_t>(R * e.C));
  e.compact(ctx.in<float>(1).data(), st.xe.data());
  std::vector<float>& z = e.ws.scratch.moe.z;
  grow(z, static_cast<size_t>(R * e.C));
  model::moe_experts_forward<float>(e.layout, ctx.in<float>(0).data(), e.layer, static_cast<int>(e.D), st, z.data());
  e.spread(z.data(), ctx, 0);
  dev.keep_moe(ctx.out<float>(0).data(), st);
}

// inputs: x(l+1) without the MoE branch, saved(l), the experts' outputs from each experts'
// device; output: x(l+1).
void moe_combine(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  dev.waited_for_experts(scope);
  const BlockUnit u(dev, ctx);
  BoundActivations b(dev);
  model::MoeState<float>& st = b.act.moe(u.layer);
  const float* saved = ctx.in<float>(1).data();
  dev.take_moe(saved, st);
  gather_blocks(ctx, 2, st, dev.cfg().model.d_model, st.back);
  auto out = ctx.out<float>(0);
  std::memcpy(out.data(), ctx.in<float>(0).data(), sizeof(float) * out.size());
  model::moe_combine<float>(dev.cfg().model, dev.shapes().act() / dev.cfg().model.d_model, out.data(), st);
  dev.keep_moe(saved, st);
}

// inputs: saved(l), d/dx(l+1); outputs: the gradients of the rows sent to each experts' device.
void moe_bwd_send(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const BlockUnit u(dev, ctx);
  BoundActivations b(dev);
  model::MoeState<float>& st = b.act.moe(u.layer);
  const float* saved = ctx.in<float>(0).data();
  const int64_t C = dev.cfg().model.d_model;
  dev.take_moe(saved, st);
  std::vector<float>& dback = u.ws.scratch.moe.dback;
  model::moe_backward_combine<float>(dev.cfg().model, dev.shapes().act() / C, ctx.in<float>(1).data(), st, dback);
  for (size_t j = 0; j < st.send_rows.size(); ++j) {
    auto out = ctx.out<float>(j);
    const int64_t n = st.send_rows[j];
    std::memcpy(out.data(), dback.data() + first_row(st, static_cast<int>(j)) * C, sizeof(float) * n * C);
    std::fill(out.begin() + n * C, out.end(), 0.0f);
    ctx.set_used(j, sizeof(float) * out.size(), {sizeof(float) * static_cast<uint64_t>(n * C)});
  }
  dev.keep_moe(saved, st);
}

// inputs: params, saved(l), x(l), d/dx(l+1)[, the piece so far], the rows' input gradients from
// each experts' device; outputs: d/dx(l), the layer's piece (block_bwd's; its experts' ranges
// stay zero: the experts' devices hold their gradients).
void block_bwd_remote(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  dev.waited_for_experts(scope);
  const BlockUnit u(dev, ctx);
  const int l = u.layer, P = dev.cfg().mesh.ep;
  BoundActivations b(dev);
  const float* saved = ctx.in<float>(kBwdSaved).data();
  b.act.bind_layer(l, const_cast<float*>(saved));
  b.act.bind_x(l, const_cast<float*>(ctx.in<float>(kBwdX).data()));
  float* dx = ctx.out<float>(kBwdDxOut).data();
  std::memcpy(dx, ctx.in<float>(kBwdDx).data(), sizeof(float) * dev.shapes().act());  // turned into d/dx(l) in place
  b.act.bind_dx(dx);
  auto g = ctx.out<float>(kBwdGrad);
  if (ctx.num_inputs() > kBwdGradPrev + static_cast<size_t>(P))
    std::memcpy(g.data(), ctx.in<float>(kBwdGradPrev).data(), sizeof(float) * g.size());
  else
    std::fill(g.begin(), g.end(), 0.0f);
  model::MoeState<float>& st = b.act.moe(l);
  dev.take_moe(saved, st);
  gather_blocks(ctx, ctx.num_inputs() - static_cast<size_t>(P), st, dev.cfg().model.d_model, st.dxback);
  model::ExpertComm<float> ep;
  ep.size = P;
  ep.at = model::ExpertsAt::kRemote;
  model::block_backward<float>(u.layout, ctx.in<float>(kBwdParams).data(), g.data() - u.layout.layer(l).begin, l, b.act,
                               u.ws.scratch, {}, ep);
}

// inputs: params, expert_fwd's output (its state's key), the rows' output gradients from each
// dense device[, the layer's gradient piece so far]; outputs: the rows' input gradients, the
// layer's gradient piece (expert-parallel rank j's layout; only its experts' ranges are written).
void expert_bwd(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  ExpertUnit e(dev, ctx);
  model::MoeState<float>& st = e.st();
  dev.take_moe(ctx.in<float>(1).data(), st);
  model::MoeScratch<float>& sc = e.ws.scratch.moe;
  int64_t R = 0;
  for (int64_t k = 0; k < e.D; ++k) R += e.block(k);
  grow(sc.dz, static_cast<size_t>(R * e.C));
  e.compact(ctx.in<float>(2).data(), sc.dz.data());
  auto g = ctx.out<float>(1);
  if (ctx.num_inputs() > 3)
    std::memcpy(g.data(), ctx.in<float>(3).data(), sizeof(float) * g.size());
  else
    std::fill(g.begin(), g.end(), 0.0f);
  model::moe_experts_backward<float>(e.layout, ctx.in<float>(0).data(), g.data() - e.layout.layer(e.layer).begin, e.layer,
                                     static_cast<int>(e.D), st, sc);
  e.spread(sc.dxe.data(), ctx, 0);
}

// inputs: the layer pieces of the MoE layers (expert_bwd's, in layer order); output: the squared
// norm of each of this device's experts' parameters, in layout order (attrs: tp, j): the terms
// spmd_train's norm adds (the update adds them in its order: step_kernels_units.cc, island_sq_norm).
void expert_sqnorm(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p{dev.cfg().mesh.dp, 1, static_cast<int>(ctx.attr(1)), 0};
  const ParamLayout& layout = dev.layout(p);
  const model::StepPlan& plan = dev.shapes().plan(1);
  model::GradView grads;
  size_t i = 0;
  for (int l = 0; l < plan.layers(); ++l)
    if (dev.shapes().moe_layer(l)) grads.add(plan.piece_ranges(model::StepPlan::layer_piece(l)), ctx.in<float>(i++).data());
  auto out = ctx.out<double>(0);
  size_t n = 0;
  for (const model::ParamInfo& q : layout.params())
    if (q.expert) out[n++] = model::sq_norm(grads.at(q.offset, q.size), static_cast<size_t>(q.size));
  PWM_CHECK_EQ(n, out.size());
}

// inputs: the experts' device's state, the dense slice's (loss, squared norm) per device (the
// update's island output), the MoE layers' pieces; outputs: the next state. AdamW on the
// experts' parameters with the dense slice's clipping (the same norm, so the same factor); the
// rest of the state (the dense layers, which the dense slice owns) passes through.
void expert_update(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p{dev.cfg().mesh.dp, 1, static_cast<int>(ctx.attr(1)), 0};
  const ParamLayout& layout = dev.layout(p);
  const model::StepPlan& plan = dev.shapes().plan(1);
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  auto shared = ctx.in<double>(State<int>::kCount);
  double loss = shared[0], sq = shared[1];
  const bool skip = pwm::train::nonfinite_step(dev.cfg().hooks, step, &loss, &sq);
  model::GradView grads;
  size_t i = State<int>::kCount + 1;
  for (int l = 0; l < plan.layers(); ++l)
    if (dev.shapes().moe_layer(l)) grads.add(plan.piece_ranges(model::StepPlan::layer_piece(l)), ctx.in<float>(i++).data());
  const auto& cfg = dev.cfg().optim;
  const double lr = model::lr_at(cfg, step), clip = model::clip_factor(cfg, sq);
  update_where(dev.cfg(), ctx, layout, grads, step, lr, clip, skip, [](const model::ParamInfo& q) { return q.expert; });
  ctx.out<int64_t>(kStep)[0] = step + 1;
}

// On experts' device j (attrs: tp, j): a state array's expert ranges, back to back in layout
// order, for expert_merge (a fraction of the whole array, which it would otherwise send).
void expert_pack(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const ParamLayout& layout =
      dev.layout(Pos{dev.cfg().mesh.dp, static_cast<int>(ctx.attr(0)), static_cast<int>(ctx.attr(1)), 0});
  const float* in = ctx.in<float>(0).data();
  auto out = ctx.out<float>(0);
  float* o = out.data();
  for (const model::ParamInfo& q : layout.params())
    if (q.expert) o = std::copy_n(in + q.offset, q.size, o);
  PWM_CHECK_EQ(o - out.data(), static_cast<std::ptrdiff_t>(out.size()));
}

// inputs: a state array of the dense slice, then each experts' device's expert_pack of the same
// array (whole, on every dense device); output: the dense device's array with its
// expert-parallel rank's experts from the experts' device of that rank: the full state
// spmd_train's rank holds, for evaluation, checkpoints and the weights hash.
void expert_merge(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = Pos::of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = dev.layout(p);
  auto out = ctx.out<float>(0);
  std::memcpy(out.data(), ctx.in<float>(0).data(), sizeof(float) * out.size());
  // Experts' device ep_rank's expert_pack: the same layout (both hold that rank's), so its ranges
  // come back to back in the order they are visited here.
  const float* experts = ctx.in<float>(1 + static_cast<size_t>(dev.ep_rank(p))).data();
  for (const model::ParamInfo& q : layout.params())
    if (q.expert) {
      std::memcpy(out.data() + q.offset, experts, sizeof(float) * static_cast<size_t>(q.size));
      experts += q.size;
    }
}

}  // namespace pwm::programs::kernels
