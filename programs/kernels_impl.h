// Internal to the kernels' sources (kernels.h declares the kernels themselves): what they share.
//   state_kernels.cc          set-up, evaluation, hash, checkpoint, trace (uses pos only)
//   step_kernels.cc           the fused step; the step's tail (finish_step) and the plan executed
//                             directly (fused_gradients), which the other step kernels end with
//   step_kernels_units.cc     one kernel per unit kind of the step plan, the dp reductions, the update
//   step_kernels_fsdp.cc      --fsdp: the step and the update on the dp shards (fsdp_gradients,
//                             shard_update), the gathers and reduce-scatters as kernels
//   step_kernels_replicas.cc  replicas: an island's step and the cross-island exchange
// Each function is described where it is defined.
#pragma once

#include <cstring>

#include "model/params.h"
#include "programs/kernels.h"
#include "train/step.h"

namespace pwm::programs::kernels {

using collectives::Algorithm;
using collectives::Communicator;
using collectives::ReduceOp;
using model::ParamLayout;

inline Pos pos(const KernelContext& ctx) { return Pos::of(ctx, static_cast<int>(ctx.attr(0))); }  // attrs[0] = tp

// A state update's pass-through (a skipped step, parameters not this kernel's to update): a copy,
// or nothing where the output took the input's buffer (Signature::reuse, in_place in kernels.cc).
inline void pass_through(float* out, const float* in, size_t n) {
  if (out != in) std::memcpy(out, in, sizeof(float) * n);
}

// step_kernels.cc
pwm::train::UpdateResult finish_step(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const ParamLayout& layout,
                                int64_t step, double local_loss, const model::GradView& grads, double* comm_s,
                                double* loss_out, const double* replicas_loss_sum = nullptr,
                                const double* given_sq = nullptr, double* shared = nullptr);
void trace_units(TrainingDevice& dev, pwm::train::StepHooks& hooks);
double fused_gradients(TrainingDevice& dev, KernelContext& ctx, const Pos& p, const pwm::train::TrainConfig& cfg,
                       int data_index, double* comm_s);

// step_kernels_fsdp.cc
double fsdp_gradients(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int64_t step, int data_index,
                      float* grads, double* comm_s);
pwm::train::UpdateResult shard_update(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int64_t step,
                                     const float* grads, double local_loss, const double* loss_sum, double* comm_s,
                                     double* loss_out);

}  // namespace pwm::programs::kernels
