// pathways_train's controller side: the training step as Pathways programs.
//
//   fused     one compiled function per step per device (pw_fused_step) on a dp x tp slice;
//   chained   one traced program per step: per micro-batch a batch node, embed, L block forward
//             nodes, the head, L block backward nodes and the embedding backward; then one dp
//             AllReduce node per gradient piece and an update node, dispatched at once;
//   opbyop    the same nodes, each its own program (one client round trip each);
//   pipeline  --stages S slices of one device each, spread over the islands, consecutive layers
//             per stage, --microbatches M in GPipe or 1F1B node order; activations and their
//             gradients flow stage to stage, worker to worker.
// The programs are traced from the step plan (model/step_plan.h) in step_program.h; the kernels
// they name are in kernels.h, registered under a KernelNames prefix.
// Parameters and optimizer state stay in the workers' object stores across steps (each step's
// program consumes the state arrays and returns the next ones); the controller fetches only the
// per-step statistics (loss, gradient norm, timings), the validation loss and the weights hash.
#pragma once

#include <string>

#include "model/train_config.h"
#include "pathways/client.h"
#include "pathways/train/step_io.h"

namespace pwm::pathways::train {

struct PathwaysOptions {
  std::string granularity = "fused";  // fused | chained | opbyop
  int stages = 1;                     // > 1: pipeline (each stage a dp x tp slice)
  std::string schedule = "gpipe";     // gpipe | 1f1b
  std::string islands;                // resource manager islands ("" = by host; "KxM")
  bool sequential = false;            // sequential dispatch (the paper's baseline)
};

// Runs the whole training on world rank 0 through `client`. `resume` says that a checkpoint
// (already validated by model::load_resume_checkpoint) is to be loaded by the workers.
// The kernels must be registered under `names` (kernels.h) on every rank. Blocks until the
// training ends. Returns the weights hash.
std::string run_training(const model::TrainConfig& cfg, const PathwaysOptions& opts, Client& client,
                         int num_islands, double peak_gflops, bool resume, const KernelNames& names = {});

}  // namespace pwm::pathways::train
