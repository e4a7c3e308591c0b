// mpmd_train's trainer: the static model. Every rank builds the same step program from the step
// plan (programs/trace.h, the program pathways_train's chained step runs), lowers it with the
// same fixed mapping of slices onto world ranks, keeps its own instruction list and runs it with
// the Executor: no controller, no dispatch messages, the transfers as point-to-point messages
// between the ranks that hold the values (docs/static_mpmd.md).
//
//   fused     one node per step per device (the fused step kernel);
//   chained   the plan's units, one node each, the dp AllReduce nodes and the update.
// Each rank's state (parameters, AdamW moments, step counter) stays in its own buffers: a step
// consumes its shards and returns the next ones. The step statistics are gathered over the world
// after each step (every rank writes the same report; rank 0 writes the files), as spmd_train's.
// The schedule of the run (evaluations, checkpoints, hooks) is the shared loop's (train/loop.h).
//
// Which ranks call: every world rank constructs a Trainer and calls run(), collectively; the
// world is exactly the slice (dp x tp ranks).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/trace.h"
#include "dataflow/lowering.h"
#include "programs/step_io.h"
#include "static_mpmd/executor.h"
#include "train/bootstrap.h"
#include "train/config.h"
#include "train/loop.h"
#include "train/report.h"

namespace pwm::static_mpmd {

// What mpmd_train's start-up checks (train/bootstrap.h): every rank is a device of the slice.
train::TrainerSpec trainer_spec();

// The run's name in its log lines and metrics: "static-<granularity>".
std::string run_name(const train::TrainConfig& cfg);

class Trainer final : public train::Trainer {
 public:
  // Builds and lowers the programs, then initializes the state (or, with `resume`, loads the
  // checkpoint already validated by train::load_resume_checkpoint): collective over the world.
  // The kernels must be registered under `names` on every rank (programs/kernels.h) and this
  // rank's training device attached. The GEMM peak: --peak-gflops, else every device probes now.
  Trainer(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport, bool resume,
          const programs::KernelNames& names = {});
  ~Trainer() override;

  // Trains through the shared run loop; returns the weights hash, or nullopt when a step was
  // non-finite beyond --skip-nonfinite (stop_error() says why, the same on every rank). A failed
  // output or kernel throws: run_mpi_main ends the job with its one line.
  std::optional<std::string> run();
  const std::string& stop_error() const { return stop_error_; }

  // train::Trainer: every call is collective over the world.
  int64_t first_step() const override { return first_step_; }
  bool step(int64_t step) override;
  void pause() override { last_end_us_ = -1; }
  void probe_peak() override;
  double evaluate() override;
  bool save(int64_t steps_done) override;
  void before_final() override;
  std::optional<std::string> finish() override;
  void fail() override { stop_error_ = report_->stop(); }
  train::TrainReport& report() override { return *report_; }

 private:
  // A program lowered for the slice; this rank's list only.
  dataflow::WorkerProgram lower(const dataflow::ProgramDef& def);
  // A one-node program of `kernel` over the slice, run at once on `inputs` (its parameters in order).
  std::vector<BufferPtr> single(const std::string& kernel, const std::vector<BufferPtr>& inputs,
                                std::vector<int64_t> attrs);
  std::vector<BufferPtr> run_program(const dataflow::WorkerProgram& p, const std::vector<BufferPtr>& inputs,
                                     RunStats* stats = nullptr);
  dataflow::ProgramDef step_program() const;
  // Rank 0's shard's first word, on every rank (a kernel writes shard 0's answer: the validation
  // loss, the hash).
  template <typename T>
  T from_rank0(const BufferPtr& b);
  double probe(double budget_s);  // the gemm_probe kernel on every device: the mean rate

  train::TrainConfig cfg_;
  std::shared_ptr<collectives::Transport> t_;
  collectives::Communicator world_;
  programs::KernelNames names_;
  programs::Shapes sh_;
  int devices_;
  Executor exec_;
  std::map<std::string, dataflow::WorkerProgram> singles_;  // built once per kernel and attributes
  dataflow::WorkerProgram step_;
  std::vector<BufferPtr> state_;  // params, m, v, step: this rank's shards
  std::unique_ptr<train::TrainReport> report_;
  int64_t first_step_ = 0;
  double last_end_us_ = -1;
  std::vector<double> recv_wait_ms_;  // per step: this rank's waits for receives
  uint64_t messages_ = 0;             // this rank's point-to-point sends, every step
  std::string stop_error_;
};

}  // namespace pwm::static_mpmd
