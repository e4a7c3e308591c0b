// What a run reads and writes, checked on every rank before it starts (train/bootstrap.h calls
// these): the resume checkpoint, the training data, the output paths, the memory the mesh needs;
// and a GEMM rate probe of one product (MFU's peak is the model-shape probe: train/peak.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"

namespace pwm::train {
struct RunFigures;

// The checkpoint a run with `cfg` resumes from: nullopt unless cfg.outputs.resume and cfg.outputs.ckpt exists.
// Throws pwm::Error with one line if the file is corrupt, was written for another model config
// or another workload (TrainConfig::workload_json), has no optimizer state, or holds a
// non-finite parameter or moment (check_finite). Both trainers
// call it on every rank before training, so a mismatch is reported before anything runs.
std::optional<Checkpoint> load_resume_checkpoint(const TrainConfig& cfg);

// The dataset of `cfg` (the default corpus when cfg.workload.data is empty, which it then names), checked
// to fit one sequence and one validation batch; throws pwm::Error with one line otherwise.
std::unique_ptr<TextDataset> open_training_data(TrainConfig& cfg);
// A path and the flag or setting that gave it: ("--metrics", "m.jsonl").
using NamedPath = std::pair<std::string, std::string>;

// The run's output files: --metrics, --trace and --ckpt where given, then `more`.
std::vector<NamedPath> output_paths(const TrainConfig& cfg, const std::vector<NamedPath>& more = {});
// Every path of the run checked without opening anything (every rank calls it, so each makes the
// same decision): the data (cfg.workload.data, the default corpus named when empty) is a regular
// file or a directory of them; the resume checkpoint, if --resume finds one, a regular file that
// fits in memory; each output is distinct from the others and from every input (the data or a
// file inside its directory, the --config file), compared by the file they resolve to. Throws
// pwm::Error with one line. Returns the bytes the data will take in memory.
uint64_t check_paths(TrainConfig& cfg, const std::vector<NamedPath>& outputs);
// Checks that each output can be written: not a directory or special file, the parent directory
// exists, a file can be created there (common/atomic_file.h check_output_path; it creates and
// removes a probe file, so one rank calls it).
void check_output_paths(const std::vector<NamedPath>& outputs);

// What one compute rank allocates (bytes; the largest rank: a pipeline's first stage), by
// component, from the configuration alone (train/memory.cc). Computed in doubles (no overflow for
// absurd configs). Not counted: the process itself (MPI, libraries, the GEMM probe: its floor,
// ~25 MiB) and the training data (check_memory's `data_bytes`). tests/spmd/memory_cases.py holds
// it to the measured peak RSS less that floor over a matrix of configurations.
struct MemoryEstimate {
  double state = 0;        // parameters, gradients, AdamW m and v (experts: this rank's; --fsdp: a 1/dp shard)
  double gathers = 0;      // --fsdp: the gathered layers' parameters and gradients in flight
  double activations = 0;  // a micro-batch's saved activations, the head's, x in every layer, the backward's scratch
  double in_flight = 0;    // a pipeline's further micro-batches whose activations a stage holds
  double moe = 0;          // the MoE layers' routing and expert rows (dropless: the worst case), scratch
  double runtime = 0;      // MPMD: the step's intermediates the runtime holds beside the kernels' buffers
  double total() const { return state + gathers + activations + in_flight + moe + runtime; }
};
// `mpmd`: the estimate for pathways_train's workers and mpmd_train's ranks, whose runtimes hold
// one step's intermediates (counted as one more step's activations and MoE rows). A pipeline
// stage's state arrays are the whole layout's (programs/step_io.cc), in every trainer.
MemoryEstimate estimate_memory(const TrainConfig& cfg, bool mpmd = false);
double estimated_memory_bytes(const TrainConfig& cfg, bool mpmd = false);  // estimate_memory(...).total()
// Sets the final report's memory_estimate_bytes and its parts (train/figures.h).
void report_memory_estimate(const TrainConfig& cfg, bool mpmd, RunFigures& figures);
// MemAvailable from /proc/meminfo (sysconf's available pages elsewhere); -1 if unknown.
double available_memory_bytes();
// Throws pwm::Error with one line giving both numbers if `ranks_on_host` compute ranks of this
// config, plus `data_bytes` (the training data every process on this host holds), need more than
// this host has available. Call before allocating anything large.
void check_memory(const TrainConfig& cfg, int ranks_on_host, double data_bytes = 0, bool mpmd = false);

// Single-thread sgemm throughput (GFLOP/s) through model::gemm on an M x N x K product, best of
// `reps` (model_bench --peak-only's 1024^3 rate, and its --profile's products timed alone).
// op(A) is [M,K], op(B) is [K,N] (stored transposed when trans_a / trans_b).
double measure_gemm_gflops(int64_t M = 1024, int64_t N = 1024, int64_t K = 1024, int reps = 5,
                           bool trans_a = false, bool trans_b = false);

}  // namespace pwm::train
