// The compute of one training step, shared by spmd_train and pathways_train so that both run
// the same floating-point operations in the same order (their results then agree bitwise).
// No MPI: the caller supplies the tp reduction and is told when parts of the gradient buffer
// are final, so that it can overlap its dp reduction with the rest of the backward.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "model/data.h"
#include "model/train_config.h"
#include "model/transformer.h"

namespace pwm::model {

// The gradient buffer's parts in the order backward finishes them: final_norm, layer L-1, ...,
// layer 0, embed (the tied embedding's lookup part comes last). Adjacent element ranges listed
// from the end of the buffer to its start.
std::vector<std::pair<int64_t, int64_t>> backward_units(const ParamLayout& layout);
inline int unit_of_layer(const ParamLayout& layout, int layer) {
  return 1 + static_cast<int>(layout.config().n_layers) - 1 - layer;
}

struct StepHooks {
  TpReduce<float> tp_reduce;                // sums over the tp group; empty for tp = 1
  std::function<void(int unit)> unit_done;  // during the LAST micro-batch's backward; may be empty
  std::function<void(const char* name, int64_t start_us, int64_t end_us)> span;  // trace; may be empty
  std::function<void(int64_t micro)> after_forward;  // testing hooks (the kill test); may be empty
};

// Zeroes `grads`, then for each of cfg.microbatches micro-batches of this dp rank's rows of
// step `step`: forward and backward (exactly model::forward_backward's pieces), accumulating
// grads += d(mean loss)/d(params) / (microbatches * dp). Returns the mean of the micro-batch
// losses (this dp rank's share of the global batch loss). `tokens` holds one micro-batch.
double accumulate_gradients(const TrainConfig& cfg, const ParamLayout& layout, const TextDataset& data,
                            int64_t step, int dp_rank, const float* params, float* grads,
                            Workspace<float>& ws, int32_t* tokens, const StepHooks& hooks);

// Clipping and AdamW, given the gradient's global squared norm (already reduced over tp).
struct UpdateResult {
  double lr = 0, grad_norm = 0;
};
UpdateResult apply_update(const TrainConfig& cfg, const ParamLayout& layout, int64_t step, double global_sq_norm,
                          float* params, const float* grads, float* m, float* v);

// The same, out of place (params/m/v in, new params/m/v out): the same bits as apply_update.
UpdateResult apply_update_into(const TrainConfig& cfg, const ParamLayout& layout, int64_t step,
                               double global_sq_norm, const float* params, const float* grads,
                               const float* m, const float* v, float* params_out, float* m_out,
                               float* v_out);

// Sum over this dp rank's rows of validation batches 0..n-1 of (mean micro-batch loss x rows);
// divide the dp sum by n * global_batch for the validation loss. n = validation_batches(...).
double validation_loss_sum(const TrainConfig& cfg, const ParamLayout& layout, const TextDataset& data,
                           int dp_rank, const float* params, Workspace<float>& ws, int32_t* tokens,
                           const TpReduce<float>& tp_reduce);
int64_t validation_batches(const TrainConfig& cfg, const TextDataset& data);

}  // namespace pwm::model
