#include "train/step.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/time.h"
#include "model/optim.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

double accumulate_gradients(const TrainConfig& cfg, const ParamLayout& layout, const StepPlan& plan,
                            const TextDataset& data, int64_t step, int dp_rank, const float* params, float* grads,
                            Workspace<float>& ws, int32_t* tokens, const StepHooks& hooks) {
  PWM_CHECK_EQ(plan.microbatches(), cfg.workload.microbatches);
  const int64_t G = cfg.workload.global_batch, M = cfg.workload.microbatches;
  const float grad_scale = 1.0f / static_cast<float>(M * cfg.data_parallel());
  auto span = [&](const char* name, int64_t t0, int64_t t1) {
    if (hooks.span) hooks.span(name, t0, t1);
  };
  std::fill(grads, grads + layout.total(), 0.0f);
  auto& act = ws.act;
  auto& scratch = ws.scratch;
  double loss_sum = 0;
  int64_t t_fwd = 0, t_bwd = 0;
  // The plan's units, one after the other; the last micro-batch tells the caller when a range
  // of the gradient is final, so that its dp reduction overlaps the rest of the backward.
  for (const Unit& u : plan.units()) {
    const int64_t t_unit = hooks.span ? now_us() : 0;
    switch (u.kind) {
      case UnitKind::kBatch: {
        const RowRange rows = batch_rows(G, dp_rank, cfg.data_parallel(), u.micro, M);
        data.train_batch(cfg.workload.data_seed, step, G, cfg.model.seq_len, rows.begin, rows.end, tokens);
        t_fwd = now_us();
        break;
      }
      case UnitKind::kEmbedForward: embed_forward<float>(layout, params, tokens, act); break;
      case UnitKind::kBlockForward:
        block_forward<float>(layout, params, u.layer, act, scratch, hooks.tp_reduce, hooks.ep);
        // Layer by layer, in forward order (as pathways_train's block kernels add them).
        if (hooks.moe && layout.layer(u.layer).moe) hooks.moe->add(act.moe(u.layer).stats);
        break;
      case UnitKind::kHead:
        loss_sum += head_forward<float>(layout, params, tokens, act);
        t_bwd = now_us();
        span("forward", t_fwd, t_bwd);
        if (hooks.after_forward) hooks.after_forward(u.micro);
        head_backward<float>(layout, params, grads, tokens, grad_scale, act, scratch);
        break;
      case UnitKind::kBlockBackward:
        block_backward<float>(layout, params, grads, u.layer, act, scratch, hooks.tp_reduce, hooks.ep);
        break;
      case UnitKind::kEmbedBackward:
        embed_backward<float>(layout, grads, tokens, act);
        break;
    }
    // Each backward unit's own span (the overlap test reads the order of these and the buckets).
    if (hooks.span && (u.kind == UnitKind::kBlockBackward || u.kind == UnitKind::kEmbedBackward))
      span(unit_kind_name(u.kind), t_unit, now_us());
    const int finished = plan.finishes(u);
    if (finished >= 0 && u.micro == M - 1 && hooks.unit_done) hooks.unit_done(finished);
    if (u.kind == UnitKind::kEmbedBackward) span("backward", t_bwd, now_us());
  }
  return loss_sum / static_cast<double>(M);
}

UpdateResult apply_update(const TrainConfig& cfg, const ParamLayout& layout, int64_t step, double global_sq_norm,
                          float* params, const float* grads, float* m, float* v) {
  UpdateResult r;
  r.lr = lr_at(cfg.optim, step);
  r.grad_norm = std::sqrt(global_sq_norm);
  adamw_step(cfg.optim, layout, step, r.lr, clip_factor(cfg.optim, global_sq_norm), params, grads, m, v);
  return r;
}

UpdateResult apply_update_into(const TrainConfig& cfg, const ParamLayout& layout, int64_t step,
                               double global_sq_norm, const float* params, const float* grads,
                               const float* m, const float* v, float* params_out, float* m_out,
                               float* v_out) {
  return apply_update_into(cfg, layout, step, global_sq_norm, params, GradView(layout, grads), m, v, params_out,
                           m_out, v_out);
}

UpdateResult apply_update_into(const TrainConfig& cfg, const ParamLayout& layout, int64_t step,
                               double global_sq_norm, const float* params, const GradView& grads,
                               const float* m, const float* v, float* params_out, float* m_out,
                               float* v_out) {
  UpdateResult r;
  r.lr = lr_at(cfg.optim, step);
  r.grad_norm = std::sqrt(global_sq_norm);
  adamw_step_into(cfg.optim, layout, step, r.lr, clip_factor(cfg.optim, global_sq_norm), params, grads, m, v,
                  params_out, m_out, v_out);
  return r;
}

bool nonfinite_step(const TestHooks& hooks, int64_t step, double* loss, double* grad_sq_norm) {
  if (step == hooks.nan_step) {
    if (loss) *loss = std::numeric_limits<double>::quiet_NaN();
    *grad_sq_norm = std::numeric_limits<double>::quiet_NaN();
  }
  return (loss && !std::isfinite(*loss)) || !std::isfinite(*grad_sq_norm);
}

int64_t validation_batches(const TrainConfig& cfg, const TextDataset& data) {
  return std::min(cfg.workload.eval_batches, data.num_val_batches(cfg.workload.global_batch, cfg.model.seq_len));
}

double validation_loss_sum(const TrainConfig& cfg, const ParamLayout& layout, const TextDataset& data,
                           int dp_rank, const float* params, Workspace<float>& ws, int32_t* tokens,
                           const TpReduce<float>& tp_reduce, const ExpertComm<float>& ep) {
  const int64_t G = cfg.workload.global_batch, T = cfg.model.seq_len, b = cfg.micro_batch();
  double sum = 0;
  for (int64_t i = 0; i < validation_batches(cfg, data); ++i)
    for (int64_t mb = 0; mb < cfg.workload.microbatches; ++mb) {
      const RowRange rows = batch_rows(G, dp_rank, cfg.data_parallel(), mb, cfg.workload.microbatches);
      data.val_batch(i, G, T, rows.begin, rows.end, tokens);
      sum += static_cast<double>(forward_loss<float>(layout, params, tokens, b, ws, tp_reduce, ep)) * b;
    }
  return sum;
}

ExpertSplit split_experts(const ParamLayout& layout, const std::vector<std::pair<int64_t, int64_t>>& finish_order) {
  ExpertSplit s;
  for (const auto& [lo, hi] : finish_order) {
    int64_t cut = hi;
    for (int l = 0; l < layout.config().n_layers; ++l) {
      const LayerOffsets& lay = layout.layer(l);
      if (lay.moe && lay.begin == lo && lay.end == hi) cut = lay.expert_gate_up;
    }
    PWM_CHECK(cut > lo, "a finish range [{}, {}) holds no dense gradient", lo, hi);
    s.dense.push_back({lo, cut});
    s.expert_of.push_back(cut < hi ? static_cast<int>(s.experts.size()) : -1);
    if (cut < hi) s.experts.push_back({cut, hi});
  }
  return s;
}

}  // namespace pwm::train
