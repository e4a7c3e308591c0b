// The compute of one training step, shared by spmd_train and pathways_train so that both run
// the same floating-point operations in the same order (their results then agree bitwise).
// No MPI: the caller supplies the tp reduction and is told when parts of the gradient buffer
// are final, so that it can overlap its dp reduction with the rest of the backward.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "train/data.h"
#include "model/step_plan.h"
#include "train/config.h"
#include "model/transformer.h"

namespace pwm::train {

struct StepHooks {
  model::TpReduce<float> tp_reduce;                // sums over the tp group; empty for tp = 1
  model::ExpertComm<float> ep;                     // the expert-parallel group's AllToAll (size 1: none)
  model::MoeStats* moe = nullptr;                  // receives the MoE layers' statistics (summed); may be null
  // During the LAST micro-batch's backward: range `i` of plan.finish_order() is final. May be empty.
  std::function<void(int i)> unit_done;
  std::function<void(const char* name, int64_t start_us, int64_t end_us)> span;  // trace; may be empty
  std::function<void(int64_t micro)> after_forward;  // testing hooks (the kill test); may be empty
};

// Executes `plan` (model/step_plan.h; plan.microbatches() == cfg.workload.microbatches): zeroes `grads`,
// then for each micro-batch of this data-parallel rank's rows of step `step` forward and backward
// (exactly model::forward_backward's pieces), accumulating
// grads += d(mean loss)/d(params) / (microbatches * data_parallel()). `dp_rank` is the rank's
// index among all data-parallel ranks, replica * dp + dp_index (TrainConfig::data_parallel()). Returns the mean of the micro-batch
// losses (this dp rank's share of the global batch loss). `tokens` holds one micro-batch.
double accumulate_gradients(const TrainConfig& cfg, const model::ParamLayout& layout, const model::StepPlan& plan,
                            const TextDataset& data, int64_t step, int dp_rank, const float* params, float* grads,
                            model::Workspace<float>& ws, int32_t* tokens, const StepHooks& hooks);

// Clipping and AdamW, given the gradient's global squared norm (already reduced over tp).
struct UpdateResult {
  double lr = 0, grad_norm = 0;
};
UpdateResult apply_update(const TrainConfig& cfg, const model::ParamLayout& layout, int64_t step, double global_sq_norm,
                          float* params, const float* grads, float* m, float* v);

// The same, out of place (params/m/v in, new params/m/v out): the same bits as apply_update.
UpdateResult apply_update_into(const TrainConfig& cfg, const model::ParamLayout& layout, int64_t step,
                               double global_sq_norm, const float* params, const float* grads,
                               const float* m, const float* v, float* params_out, float* m_out,
                               float* v_out);
UpdateResult apply_update_into(const TrainConfig& cfg, const model::ParamLayout& layout, int64_t step,
                               double global_sq_norm, const float* params, const model::GradView& grads,
                               const float* m, const float* v, float* params_out, float* m_out,
                               float* v_out);

// The rule for a non-finite step, the same on every rank and in every trainer: after the step's
// reductions (the loss over dp, the squared gradient norm over tp and dp), applies the --nan-step
// hook (both made NaN at that step) and returns true when the loss or the squared norm is not
// finite. The caller then skips the update (parameters and AdamW moments unchanged, the step
// counted as taken) and reports the step; the report decides whether the run goes on
// (--skip-nonfinite, train/report.h). `loss` may be null where it is not known (a pipeline's
// stages before the last: the norm alone decides there; backpropagation carries a non-finite
// loss into the gradient, so the verdict is the same).
bool nonfinite_step(const TestHooks& hooks, int64_t step, double* loss, double* grad_sq_norm);

// Sum over this dp rank's rows of validation batches 0..n-1 of (mean micro-batch loss x rows);
// divide the dp sum by n * global_batch for the validation loss. n = validation_batches(...).
double validation_loss_sum(const TrainConfig& cfg, const model::ParamLayout& layout, const TextDataset& data,
                           int dp_rank, const float* params, model::Workspace<float>& ws, int32_t* tokens,
                           const model::TpReduce<float>& tp_reduce,
                           const model::ExpertComm<float>& ep = model::ExpertComm<float>{});

// Expert parallelism: the gradient buffer's ranges of `finish_order` split into what is reduced
// over dp (dense: each range without its layer's local experts) and what is reduced over the
// ranks holding the same experts (experts: [expert_gate_up, end) of each MoE layer), both listed
// in finish order; expert_of[i] is the index in `experts` of finish range i's experts (-1: none).
struct ExpertSplit {
  std::vector<std::pair<int64_t, int64_t>> dense, experts;
  std::vector<int> expert_of;
};
ExpertSplit split_experts(const model::ParamLayout& layout, const std::vector<std::pair<int64_t, int64_t>>& finish_order);
int64_t validation_batches(const TrainConfig& cfg, const TextDataset& data);

}  // namespace pwm::train
