// The Transformer's compiled functions for the Pathways runtime (pathways_train).
//
// Registered by name on every rank (the controller uses the signatures, the workers run them).
// Each kernel runs once per device of its slice, over object-store buffers; per-device shards
// follow the SPMD trainer's mesh: a slice of dp x tp devices, device k = dp index k / tp, tp
// index k % tp, so device k holds exactly what SPMD's world rank k holds, and runs the same
// floating-point operations (model/train_step.h), which is why the two trainers agree bitwise.
//
// Buffers per device: params, adam_m, adam_v (float[layout.total()], the tp shard), step
// (int64[1]), stats (float64[kStats]). Temporaries that are not values of the program
// (gradients of the fused step, GEMM scratch) live in a per-worker cache, like XLA's temp
// buffers; everything a later node reads is an object-store buffer.
#pragma once

#include <memory>
#include <string>

#include "collectives/transport.h"
#include "model/data.h"
#include "model/train_config.h"

namespace pwm::pathways::train {

// What one step reports per device, as float64[kStats] (the step's last kernel writes it):
// kBusyMs is the time the device spent in kernels since the previous step's report.
// kEndUs is the worker's monotonic clock (us) when the step's last kernel ended: step times are
// the differences between consecutive steps' ends on one device, free of the controller's delays.
enum Stat { kLoss = 0, kGradNorm, kLr, kComputeMs, kCommMs, kKernelMs, kBusyMs, kEndUs, kStats };

struct PipelineShape {
  int stages = 1;
  // Layers of stage s: [layer_begin(s), layer_begin(s+1)).
  int layer_begin(int s, int n_layers) const { return static_cast<int>(static_cast<int64_t>(n_layers) * s / stages); }
};

// Registers every training kernel in the global registry. `data` may be null on the controller
// (it never runs kernels). Call once per process, before the runtime or the worker starts.
void register_train_kernels(const model::TrainConfig& cfg, PipelineShape pipe,
                            std::shared_ptr<collectives::Transport> transport,
                            std::shared_ptr<const model::TextDataset> data);

}  // namespace pwm::pathways::train
