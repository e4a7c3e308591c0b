// Evaluation of a model on raw bytes, and loading a checkpoint's full tensors into a parameter
// buffer (used by model/tools/pwm_eval and the trainers' evaluation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/checkpoint.h"
#include "model/params.h"

namespace pwm::train {

// The unsharded parameter buffer [layout.total()] (layout must be tp_size 1) or, for tp > 1, this
// rank's shard, filled from the checkpoint's full tensors. Throws pwm::Error naming the
// checkpoint and the tensor on a missing tensor, a shape mismatch or an extra tensor.
std::vector<float> params_from_checkpoint(const Checkpoint& ckpt, const model::ParamLayout& layout);

struct EvalResult {
  int64_t windows = 0;  // windows of seq_len + 1 bytes evaluated
  int64_t tokens = 0;   // predictions scored: windows * seq_len
  double xent = 0;      // mean cross-entropy, nats/token
  double loss = 0;      // mean training objective (cross-entropy + z_loss * lse^2)
};

// Cuts `bytes` into windows w = bytes [w*T, w*T + T + 1) (consecutive windows share one byte, so
// every byte after the first is predicted once; a tail shorter than a window is left out), at
// most `max_windows` of them (0: all), and runs forward_loss over batches of `batch` windows.
// Throws pwm::Error if not even one window fits or the vocabulary cannot hold bytes.
EvalResult evaluate_bytes(const model::ParamLayout& layout, const float* params, const std::string& bytes,
                          int64_t batch, int64_t max_windows = 0);

}  // namespace pwm::train
