// What a run reads and writes, checked on every rank before it starts (train/bootstrap.h calls
// these): the resume checkpoint, the training data, the output paths, the memory the mesh needs;
// and the GEMM rate MFU is measured against.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"

namespace pwm::train {

// The checkpoint a run with `cfg` resumes from: nullopt unless cfg.outputs.resume and cfg.outputs.ckpt exists.
// Throws pwm::Error with one line if the file is corrupt, was written for another model config
// or another workload (TrainConfig::workload_json), has no optimizer state, or holds a
// non-finite parameter or moment (check_finite). Both trainers
// call it on every rank before training, so a mismatch is reported before anything runs.
std::optional<Checkpoint> load_resume_checkpoint(const TrainConfig& cfg);

// The dataset of `cfg` (the default corpus when cfg.workload.data is empty, which it then names), checked
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

}  // namespace pwm::train
