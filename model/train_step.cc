#include "model/train_step.h"

#include <algorithm>
#include <cmath>

#include "common/time.h"
#include "model/optim.h"

namespace pwm::model {

std::vector<std::pair<int64_t, int64_t>> backward_units(const ParamLayout& layout) {
  std::vector<std::pair<int64_t, int64_t>> u;
  const int64_t C = layout.config().d_model;
  u.push_back({layout.final_norm_offset(), layout.final_norm_offset() + C});
  for (int l = static_cast<int>(layout.config().n_layers) - 1; l >= 0; --l)
    u.push_back({layout.layer(l).begin, layout.layer(l).end});
  const ParamInfo& e = layout.get("embed");
  u.push_back({e.offset, e.offset + e.size});
  return u;
}

double accumulate_gradients(const TrainConfig& cfg, const ParamLayout& layout, const TextDataset& data,
                            int64_t step, int dp_rank, const float* params, float* grads,
                            Workspace<float>& ws, int32_t* tokens, const StepHooks& hooks) {
  const int64_t G = cfg.global_batch, M = cfg.microbatches;
  const int L = static_cast<int>(cfg.model.n_layers);
  const float grad_scale = 1.0f / static_cast<float>(M * cfg.dp);
  const int last_unit = L + 1;
  auto span = [&](const char* name, int64_t t0, int64_t t1) {
    if (hooks.span) hooks.span(name, t0, t1);
  };
  std::fill(grads, grads + layout.total(), 0.0f);
  auto& act = ws.act;
  auto& scratch = ws.scratch;
  double loss_sum = 0;
  for (int64_t mb = 0; mb < M; ++mb) {
    const bool last = mb == M - 1;
    auto unit_done = [&](int u) {
      if (last && hooks.unit_done) hooks.unit_done(u);
    };
    const RowRange rows = batch_rows(G, dp_rank, cfg.dp, mb, M);
    data.train_batch(cfg.data_seed, step, G, cfg.model.seq_len, rows.begin, rows.end, tokens);
    // The pieces of model::forward_backward, so that the last micro-batch can hand finished
    // layers to the caller while the next layer's backward runs.
    const int64_t t0 = now_us();
    embed_forward<float>(layout, params, tokens, act);
    for (int l = 0; l < L; ++l) block_forward<float>(layout, params, l, act, scratch, hooks.tp_reduce);
    loss_sum += head_forward<float>(layout, params, tokens, act);
    const int64_t t1 = now_us();
    span("forward", t0, t1);
    if (hooks.after_forward) hooks.after_forward(mb);
    head_backward<float>(layout, params, grads, tokens, grad_scale, act, scratch);
    unit_done(0);
    for (int l = L - 1; l >= 0; --l) {
      block_backward<float>(layout, params, grads, l, act, scratch, hooks.tp_reduce);
      unit_done(unit_of_layer(layout, l));
    }
    embed_backward<float>(layout, grads, tokens, act);
    unit_done(last_unit);
    span("backward", t1, now_us());
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
  UpdateResult r;
  r.lr = lr_at(cfg.optim, step);
  r.grad_norm = std::sqrt(global_sq_norm);
  adamw_step_into(cfg.optim, layout, step, r.lr, clip_factor(cfg.optim, global_sq_norm), params, grads, m, v,
                  params_out, m_out, v_out);
  return r;
}

int64_t validation_batches(const TrainConfig& cfg, const TextDataset& data) {
  return std::min(cfg.eval_batches, data.num_val_batches(cfg.global_batch, cfg.model.seq_len));
}

double validation_loss_sum(const TrainConfig& cfg, const ParamLayout& layout, const TextDataset& data,
                           int dp_rank, const float* params, Workspace<float>& ws, int32_t* tokens,
                           const TpReduce<float>& tp_reduce) {
  const int64_t G = cfg.global_batch, T = cfg.model.seq_len, b = cfg.micro_batch();
  double sum = 0;
  for (int64_t i = 0; i < validation_batches(cfg, data); ++i)
    for (int64_t mb = 0; mb < cfg.microbatches; ++mb) {
      const RowRange rows = batch_rows(G, dp_rank, cfg.dp, mb, cfg.microbatches);
      data.val_batch(i, G, T, rows.begin, rows.end, tokens);
      sum += static_cast<double>(forward_loss<float>(layout, params, tokens, b, ws, tp_reduce)) * b;
    }
  return sum;
}

}  // namespace pwm::model
