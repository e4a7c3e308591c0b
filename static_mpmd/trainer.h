// mpmd_train's trainer: the static model. Every rank builds the same step program from the step
// plan (programs/trace.h, the program pathways_train's chained step runs), lowers it with the
// same fixed mapping of slices onto world ranks, keeps its own instruction list and runs it with
// the Executor: no controller, no dispatch messages, the transfers as point-to-point messages
// between the ranks that hold the values (docs/static_mpmd.md).
//
//   fused     one node per step per device (the fused step kernel);
//   chained   the plan's units, one node each, the dp AllReduce nodes and the update;
//   replicas  --replicas R slices of dp x tp ranks, each one's gradient pieces exchanged with the
//             other replicas as point-to-point messages (programs/replicas.h), fused or chained;
//   pipeline  --stages S slices of dp x tp ranks (times --replicas), consecutive layers per
//             stage, --microbatches M in GPipe or 1F1B order (programs/pipeline.h): activations
//             and their gradients are point-to-point messages from stage to stage.
// Each rank's state (parameters, AdamW moments, step counter) stays in its own buffers: a step
// consumes its shards and returns the next ones. The step statistics are gathered over the world
// after each step (every rank writes the same report; rank 0 writes the files), as spmd_train's.
// The schedule of the run (evaluations, checkpoints, hooks) is the shared loop's (train/loop.h).
//
// Which ranks call: every world rank constructs a Trainer and calls run(), collectively. The world
// is exactly the slices: slice i (replica r's stage s is i = r S + s; S = 1 without --stages) is world ranks
// [i dp tp, (i + 1) dp tp), in mesh order, so that with one slice rank k holds what spmd_train's
// rank k holds.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/trace.h"
#include "dataflow/builder.h"
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
  // A program over the slices, lowered with their fixed mapping; this rank's list only.
  Prepared lower(const dataflow::ProgramDef& def);
  // Runs `p` with this rank's state bound to its slice's parameters (a program over the states
  // declares every slice's four, slice-major; `with_state` false: no parameters). Returns the
  // outputs held here, in output order.
  std::vector<BufferPtr> run_program(const Prepared& p, bool with_state, RunStats* stats = nullptr);
  // A program of one `kernel` node on every slice, no inputs (init, load, the probes, the trace).
  std::vector<BufferPtr> on_every_slice(const std::string& kernel, std::vector<int64_t> attrs);
  // The programs over every slice's state.
  std::vector<programs::State<dataflow::Value>> state_params(dataflow::Builder& b) const;
  dataflow::Value merged(dataflow::Builder& b, const std::vector<programs::State<dataflow::Value>>& st,
                         dataflow::Value programs::State<dataflow::Value>::*which, int replica) const;
  dataflow::ProgramDef step_program() const;
  dataflow::ProgramDef eval_program() const;
  dataflow::ProgramDef save_program() const;
  dataflow::ProgramDef hash_program(int replica) const;
  const Prepared& cached(const std::string& key, const std::function<dataflow::ProgramDef()>& build);
  // World rank `rank`'s first word of `b` (null where this rank holds no output), on every rank:
  // a kernel writes its answer on its slice's shard 0 (the validation loss, a replica's hash).
  template <typename T>
  T from_rank(const BufferPtr& b, int rank);
  double probe(double budget_s);  // the gemm_probe kernel on every device: the mean rate
  int slice_of(int rank) const { return rank / devices_; }

  train::TrainConfig cfg_;
  std::shared_ptr<collectives::Transport> t_;
  collectives::Communicator world_;
  programs::KernelNames names_;
  programs::Shapes sh_;
  int devices_;     // per slice (dp x tp)
  int S_, R_, K_;   // stages, replicas, slices (K = R S)
  bool pipe_;
  Executor exec_;
  std::map<std::string, Prepared> programs_;  // built, lowered and prepared once each
  std::optional<Prepared> step_;
  std::vector<BufferPtr> state_;  // params, m, v, step: this rank's shards
  std::unique_ptr<train::TrainReport> report_;
  int64_t first_step_ = 0;
  double last_end_us_ = -1;
  std::vector<double> recv_wait_ms_;  // per step: this rank's waits for receives
  std::vector<double> bubbles_;       // per step (a pipeline): 1 - busy / step time, over every device
  std::vector<double> exposed_, tails_;  // per step (replicas): programs::exchange_times
  uint64_t peak_intermediate_ = 0;    // this rank's most bytes of a step's intermediates at once
  uint64_t messages_ = 0;             // this rank's point-to-point sends, every step
  std::string stop_error_;
};

}  // namespace pwm::static_mpmd
