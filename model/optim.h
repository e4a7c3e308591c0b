// AdamW with decoupled weight decay, warm-up + cosine learning-rate schedule, global-norm
// clipping. Everything operates on spans (pointer + count) of buffers in the ParamLayout, so a
// trainer can update any slice (e.g. the bucket it owns); the moments m and v are float buffers
// of the same layout as the parameters, zero-initialized by the caller.
//
// One step, as torch.optim.AdamW (decoupled decay) after clipping:
//   g  = clip * grad                      clip = min(1, max_norm / (global_norm + 1e-6))
//   m  = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p *= 1 - lr * wd          (only tensors with ParamInfo::weight_decay: no decay on norm scales)
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)          t = 1-based step
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/grad_view.h"
#include "model/params.h"

namespace pwm::model {

struct AdamWConfig {
  double lr = 1e-3;            // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   // decoupled; matrices and the embedding only
  double max_grad_norm = 1.0;  // global-norm clipping; <= 0 disables
  int64_t warmup_steps = 0;    // linear warm-up over steps [0, warmup)
  int64_t total_steps = 0;     // cosine decay over [warmup, total); 0 = constant after warm-up
  double min_lr_frac = 0.1;    // the cosine ends at min_lr_frac * lr

  void validate() const;  // throws pwm::Error naming the bad field
};

// Learning rate of 0-based step `step`:
//   step < warmup:           lr * (step + 1) / warmup
//   warmup <= step < total:  lr * (f + (1 - f) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2)
//   step >= total (total>0): lr * f                                       (f = min_lr_frac)
double lr_at(const AdamWConfig& cfg, int64_t step);

// Sum of squares of data[0, count), accumulated in double in index order (deterministic).
double sq_norm(const float* data, size_t count);
// This tp rank's contribution to the squared global norm of a gradient buffer: the sharded
// tensors, plus the replicated ones on tp rank 0 only (they are identical on every tp rank).
// Summing it over the tp group gives the full model's squared gradient norm.
// `part` restricts it to the experts' tensors (ParamInfo::expert) or to the others: under expert
// parallelism the dense part is the same on every rank and the experts' part is summed over the
// expert-parallel group.
enum class NormPart { kAll, kDense, kExperts };
double grad_sq_norm_tp(const ParamLayout& layout, const float* grads, NormPart part = NormPart::kAll);
double grad_sq_norm_tp(const ParamLayout& layout, const GradView& grads,
                       NormPart part = NormPart::kAll);  // the same bits, over pieces
// min(1, max_norm / (sqrt(global_sq_norm) + 1e-6)); 1 when clipping is disabled.
double clip_factor(const AdamWConfig& cfg, double global_sq_norm);

// One AdamW update of elements [begin, end) of the layout's buffers (any range: it may cut
// tensors; decay is chosen per tensor). `step` is 0-based (bias correction uses t = step + 1),
// `lr` usually lr_at(cfg, step), `clip` usually clip_factor(cfg, reduced squared norm).
void adamw_update(const AdamWConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end,
                  int64_t step, double lr, double clip, float* params, const float* grads,
                  float* m, float* v);
// The whole buffer: adamw_update over [0, layout.total()).
void adamw_step(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr,
                double clip, float* params, const float* grads, float* m, float* v);

// Out of place: reads p_in, m_in, v_in and writes p_out, m_out, v_out (which may alias the
// inputs); the same arithmetic as adamw_step, so the same bits. For runtimes whose buffers are
// immutable values (the Pathways object store).
void adamw_step_into(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr,
                     double clip, const float* p_in, const float* grads, const float* m_in,
                     const float* v_in, float* p_out, float* m_out, float* v_out);
void adamw_step_into(const AdamWConfig& cfg, const ParamLayout& layout, int64_t step, double lr,
                     double clip, const float* p_in, const GradView& grads, const float* m_in,
                     const float* v_in, float* p_out, float* m_out, float* v_out);
void adamw_span_into(const AdamWConfig& cfg, int64_t step, double lr, double clip, bool decay,
                     const float* p_in, const float* grads, const float* m_in, const float* v_in,
                     float* p_out, float* m_out, float* v_out, size_t count);

// The span kernel: one tensor's elements, decay on or off.
void adamw_span(const AdamWConfig& cfg, int64_t step, double lr, double clip, bool decay,
                float* params, const float* grads, float* m, float* v, size_t count);

}  // namespace pwm::model
