// The MPMD pipeline's own kernels (each stage a dp x tp slice; attrs: tp, stage): its share of
// the squared gradient norm, the stage's update, the full state merged from the stages'
// buffers, and the small array kernels its programs use (zeros, add, sum). The stages' forward
// and backward units are the per-unit kernels (step_kernels_units.cc); their dp reductions the
// dp_allreduce kernel, inside the stage's slice.
#include <cmath>
#include <cstring>

#include "common/time.h"
#include "model/optim.h"
#include "train/step.h"
#include "programs/kernels_impl.h"

namespace pwm::programs::kernels {

void update_where(const pwm::train::TrainConfig& tc, KernelContext& ctx, const ParamLayout& layout,
                  const model::GradView& grads, int64_t step, double lr, double clip, bool skip,
                  const std::function<bool(const model::ParamInfo&)>& mine) {
  const auto& cfg = tc.optim;
  for (const model::ParamInfo& p : layout.params()) {
    const size_t n = static_cast<size_t>(p.size);
    const float* pin = ctx.in<float>(kParams).data() + p.offset;
    const float* min = ctx.in<float>(kAdamM).data() + p.offset;
    const float* vin = ctx.in<float>(kAdamV).data() + p.offset;
    float* pout = ctx.out<float>(kParams).data() + p.offset;
    float* mout = ctx.out<float>(kAdamM).data() + p.offset;
    float* vout = ctx.out<float>(kAdamV).data() + p.offset;
    if (mine(p) && !skip) {
      model::adamw_span_into(cfg, step, lr, clip, p.weight_decay, pin, grads.at(p.offset, p.size), min, vin, pout, mout,
                             vout, n);
    } else {
      pass_through(pout, pin, n);
      pass_through(mout, min, n);
      pass_through(vout, vin, n);
    }
  }
}

namespace {
Pos pipe_pos(const KernelContext& ctx) { return Pos::of(ctx, static_cast<int>(ctx.attr(0))); }  // attrs[0] = tp
}  // namespace

// inputs: the stage's gradient pieces (the tied piece, then its layers), already summed over the
// stage's dp group; output: this stage's share of the squared gradient norm (the tied piece
// counted on stage 0 only). With tp, each rank's shard of the sharded tensors plus tp rank 0's
// replicated ones, summed over the tp group (as spmd_train's norm: model::grad_sq_norm_tp).
void pipe_sqnorm(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pipe_pos(ctx);
  const int stage = static_cast<int>(ctx.attr(1));
  double s = 0;
  if (p.tp == 1) {
    for (size_t i = stage == 0 ? 0 : 1; i < ctx.num_inputs(); ++i) {
      auto a = ctx.in<float>(i);
      s += model::sq_norm(a.data(), a.size());
    }
  } else {
    const ParamLayout& layout = dev.layout(p);
    const model::StepPlan& plan = dev.shapes().plan(p.tp);
    const StageLayers sl = stage_layers(dev.shapes(), stage);
    const int L = static_cast<int>(dev.cfg().model.n_layers);
    model::GradView grads;
    grads.add(plan.piece_ranges(model::StepPlan::kTiedPiece), ctx.in<float>(0).data());
    for (int l = sl.begin; l < sl.end; ++l)
      grads.add(plan.piece_ranges(model::StepPlan::layer_piece(l)), ctx.in<float>(static_cast<size_t>(1 + l - sl.begin)).data());
    for (const model::ParamInfo& q : layout.params()) {
      const bool tied = q.layer < 0 || q.layer >= L;
      if (tied ? stage != 0 : (q.layer < sl.begin || q.layer >= sl.end)) continue;
      if (q.replicated() && layout.tp_rank() != 0) continue;
      s += model::sq_norm(grads.at(q.offset, q.size), static_cast<size_t>(q.size));
    }
    if (collectives::Communicator* c = dev.tp_comm(ctx, p)) {
      const double t0 = now_s();
      c->allreduce(&s, &s, 1, collectives::DataType::kFloat64, collectives::ReduceOp::kSum,
                   collectives::Algorithm::kRecursiveDoubling);
      dev.add_comm(now_s() - t0);
    }
  }
  ctx.out<double>(0)[0] = s;
}

// inputs: pipe_update_args(stage) (state, total squared norm, pieces, and the losses on the last
// stage); outputs: the next state and the statistics. Updates the stage's layers plus the
// embedding and the final norm (every stage holds them and receives the same gradient, so they
// stay identical); the other stages' layers pass through.
void pipe_update(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos pp = pipe_pos(ctx);
  const int stage = static_cast<int>(ctx.attr(1));
  const ParamLayout& layout = dev.layout(pp);
  const model::StepPlan& plan = dev.shapes().plan(pp.tp);
  const UpdateArgs args = pipe_update_args(dev.shapes(), stage);
  PWM_CHECK_EQ(ctx.num_inputs(), args.count());
  const StageLayers sl = stage_layers(dev.shapes(), stage);
  const int L = static_cast<int>(dev.cfg().model.n_layers);
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  // Testing hook (--kill-step/--kill-rank naming a worker): this stage's device dies after its
  // gradients and reductions, before its update (as the dense step's finish_step).
  if (dev.cfg().hooks.kill_now(step, ctx.world_rank())) dev.cfg().hooks.kill_self();
  double total_sq = ctx.in<double>(args.sq())[0];
  // The last stage's loss: each replica's island_loss (the dp sum of its devices' means), summed
  // in replica order and made the mean here.
  double loss = 0;
  for (size_t r = 0; r < args.losses; ++r) loss += ctx.in<double>(args.loss(r))[0];
  if (args.losses > 0) loss /= static_cast<double>(pp.dp) * static_cast<double>(args.losses);
  // A non-finite step passes the state through, on every stage (the norm is the whole model's;
  // the stages before the last have no loss: train::nonfinite_step).
  const bool skip = pwm::train::nonfinite_step(dev.cfg().hooks, step, args.losses > 0 ? &loss : nullptr, &total_sq);
  model::GradView grads;
  grads.add(plan.piece_ranges(model::StepPlan::kTiedPiece), ctx.in<float>(args.piece(0)).data());
  for (int l = sl.begin; l < sl.end; ++l)
    grads.add(plan.piece_ranges(model::StepPlan::layer_piece(l)), ctx.in<float>(args.piece(1 + l - sl.begin)).data());
  const auto& cfg = dev.cfg().optim;
  const double lr = model::lr_at(cfg, step), clip = model::clip_factor(cfg, total_sq);
  update_where(dev.cfg(), ctx, layout, grads, step, lr, clip, skip, [&](const model::ParamInfo& p) {
    return p.layer < 0 || p.layer >= L || (sl.begin <= p.layer && p.layer < sl.end);
  });
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, pwm::train::UpdateResult{lr, std::sqrt(total_sq)}, loss, 0.0, ctx.out<double>(StepOutputs<int>::kStats));
}

// Full state of a pipeline from its stages' buffers: stage s's layers from input s, the
// embedding and the final norm (identical on every stage) from input 0.
void merge(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const ParamLayout& layout = dev.layout(pipe_pos(ctx));  // (each device merges its own tp shard)
  float* out = ctx.out<float>(0).data();
  std::memcpy(out, ctx.in<float>(0).data(), sizeof(float) * layout.total());
  for (int s = 1; s < dev.shapes().pipe().stages; ++s) {
    const StageLayers sl = stage_layers(dev.shapes(), s);
    if (sl.end <= sl.begin) continue;
    const int64_t lo = layout.layer(sl.begin).begin, hi = layout.layer(sl.end - 1).end;
    std::memcpy(out + lo, ctx.in<float>(static_cast<size_t>(s)).data() + lo, sizeof(float) * (hi - lo));
  }
}

// The pipeline programs' small array kernels (pipeline.cc): zeros, the sum of two arrays, the sum
// of scalars.
void zeros(TrainingDevice&, KernelContext& ctx, Scope&) { std::ranges::fill(ctx.out<float>(0), 0.0f); }

void add_arrays(TrainingDevice&, KernelContext& ctx, Scope&) {
  auto a = ctx.in<float>(0), b = ctx.in<float>(1);
  auto o = ctx.out<float>(0);
  for (size_t i = 0; i < o.size(); ++i) o[i] = a[i] + b[i];
}

void sum_scalars(TrainingDevice&, KernelContext& ctx, Scope&) {
  double s = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) s += ctx.in<double>(i)[0];
  ctx.out<double>(0)[0] = s;
}

}  // namespace pwm::programs::kernels
