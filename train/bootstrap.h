// One start-up for every trainer: flags and --config, the ranks' agreement on them, validation
// with one-line errors, the data and the resume checkpoint, the GEMM peak and the report's
// header. A trainer's main is then: bootstrap, construct the trainer, run the loop.
//
// Which ranks call: every world rank, collectively (each check ends on every rank together).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "train/checkpoint.h"
#include "train/checks.h"
#include "train/config.h"
#include "train/data.h"
#include "train/flags.h"
#include "train/peak.h"

namespace pwm::train {

// What differs between trainers at start-up.
struct TrainerSpec {
  std::string program;      // "spmd_train": names the errors ("spmd_train: error: ...") and --help
  std::string description;  // --help's first line
  FlagSet flags = FlagSet::kSpmd;
  // World rank 0 is a controller that holds no tensors (pathways_train): it does not check the
  // memory, and the other ranks are the compute ranks.
  bool controller = false;
  // The trainer's own checks, on every rank: must call cfg.validate(compute ranks) and throw
  // pwm::Error with one line for a setting it cannot run. `world`: every rank of the job.
  std::function<void(const TrainConfig& cfg, int world)> validate;
  // The trainer's own output files as (setting, path), e.g. ("PWM_PW_TRACE", "rt.json"): checked
  // with --metrics, --trace and --ckpt (train/checks.h check_output_paths). May be empty.
  std::function<std::vector<NamedPath>()> more_outputs;
};

// The exit code of a run that start-up refused: a usage, configuration or input error (a bad or
// unknown flag, a mesh the launch does not fit, a missing file, too little memory), which no
// restart can fix. sysexits' EX_USAGE; the launchers pass it on (mpirun exits with it), and
// mpi_scripts/supervise.sh stops on it instead of restarting (docs/errors.md).
inline constexpr int kExitRefused = 64;

// What start-up hands the trainer.
struct Startup {
  TrainConfig cfg;
  std::shared_ptr<TextDataset> data;       // on every rank (a controller drops it)
  std::optional<Checkpoint> resume_from;   // the checkpoint to resume from, read on every rank
  std::vector<std::string> hosts;          // every world rank's processor name, index = rank
};

// Parses argv, checks that every rank parsed the same configuration, validates it (TrainConfig
// and spec.validate), checks every path without opening it (inputs are regular files that fit in
// memory, outputs are distinct and overwrite no input) and the memory, and only when every rank
// has passed, opens the data and reads the resume checkpoint (so no rank blocks opening what
// another refused). Returns the code main should return (0 after --help, kExitRefused after a bad input, which
// rank 0 has reported in one line), or nullopt to go on with `out` filled.
std::optional<int> bootstrap(int argc, char** argv, collectives::MpiEnvironment& env, const TrainerSpec& spec,
                             Startup& out);

// The per-rank GEMM peak for MFU at start-up (train/peak.h) of a trainer whose every rank
// computes: --peak-gflops, else `probe` (make_gemm_probe: this rank's) over every product of the
// step (startup_probe), on every rank at once (as they will run, one core each), averaged over them. Collective
// over `world`. (the MPMD trainers probe their devices through their runtime: mpmd::Trainer::probe.)
Peak gemm_peak(collectives::Communicator& world, const TrainConfig& cfg, model::GemmProbe* probe);
// A probe through the run: `probe` for at most about `budget_s` (GemmProbe::run) on every rank
// at once; returns the mean of their rates. Collective over `world`.
double probe_gemm_peak(collectives::Communicator& world, model::GemmProbe& probe, double budget_s);

// Rank 0's first line: "[tag] <who> | <model> | batch B x T tokens, M micro-batches | <where>GEMM
// peak P GFLOP/s per <unit> (<source>)", then the precision's line when it is not fp32.
void print_header(const std::string& tag, const std::string& who, const TrainConfig& cfg, const std::string& where,
                  const Peak& peak, const std::string& unit);

}  // namespace pwm::train
