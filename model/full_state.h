// Between a tp rank's parameter buffer and the full (unsharded) tensors that checkpoints and
// weights_hash use. A shard is a contiguous block of rows of the full tensor (params.h), so a
// full tensor is the tp shards concatenated in tp-rank order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/checkpoint.h"
#include "model/data.h"
#include "model/params.h"
#include "model/train_config.h"

namespace pwm::model {

// Gathers `count` floats from every tp rank into `out` (tp * count floats, rank order). Called
// once per sharded tensor, on every tp rank, in layout order. Empty for tp = 1.
using TpGather = std::function<void(const float* shard, float* out, size_t count)>;

// The full tensors of one buffer in layout order (every tp rank gets them all).
std::vector<TensorData> gather_full(const ParamLayout& layout, const float* buffer,
                                    const TpGather& gather);

// Fills this tp rank's buffer from full tensors (a checkpoint's). Throws pwm::Error naming a
// missing tensor or a shape mismatch.
void scatter_full(const ParamLayout& layout, const std::vector<TensorData>& full, float* buffer);

// FNV-1a 64 over the names, shapes and float bits of the full tensors, in order: the same for
// every dp/tp decomposition and both trainers. Printed as 16 hex digits.
uint64_t weights_hash(const std::vector<TensorData>& full);
std::string hash_hex(uint64_t h);

// The checkpoint a run with `cfg` resumes from: nullopt unless cfg.resume and cfg.ckpt exists.
// Throws pwm::Error with one line if the file is corrupt, was written for another model config
// or another workload (TrainConfig::workload_json), or has no optimizer state. Both trainers
// call it on every rank before training, so a mismatch is reported before anything runs.
std::optional<Checkpoint> load_resume_checkpoint(const TrainConfig& cfg);

// The dataset of `cfg` (the default corpus when cfg.data is empty, which it then names), checked
// to fit one sequence and one validation batch; throws pwm::Error with one line otherwise.
std::unique_ptr<TextDataset> open_training_data(TrainConfig& cfg);
// Checks that --metrics, --trace and --ckpt can be written: not a directory or special file, the
// parent directory exists, a file can be created there (common/atomic_file.h check_output_path).
void check_output_paths(const TrainConfig& cfg);

// A lower estimate of one compute rank's memory (bytes): parameters, gradients and AdamW
// moments of its tp shard, and the activations of one micro-batch. Computed in doubles (no
// overflow for absurd configs).
double estimated_memory_bytes(const TrainConfig& cfg);
// MemAvailable from /proc/meminfo (sysconf's available pages elsewhere); -1 if unknown.
double available_memory_bytes();
// Throws pwm::Error with one line giving both numbers if `ranks_on_host` ranks of this config
// need more than this host has available. Call before allocating anything large.
void check_memory(const TrainConfig& cfg, int ranks_on_host);

// Single-thread sgemm throughput (GFLOP/s) through model::gemm on an M x N x K product, best of
// `reps`: the peak MFU is measured against.
// op(A) is [M,K], op(B) is [K,N] (stored transposed when trans_a / trans_b).
double measure_gemm_gflops(int64_t M = 1024, int64_t N = 1024, int64_t K = 1024, int reps = 5,
                           bool trans_a = false, bool trans_b = false);

}  // namespace pwm::model
