// The one MPMD trainer: the Transformer's training step as dataflow programs over a runtime
// (dataflow/runtime.h), for both MPMD execution models (mpmd/backend.h):
//   pathways_train  a single controller (world rank 0) runs it over the Pathways client; the other
//                   ranks are the workers of its slices (pathways/client_runtime.h);
//   mpmd_train      every rank runs it over the static runtime and runs its own part of each
//                   program in the order fixed when it was built (static_mpmd/static_runtime.h).
// Modes (cfg.mpmd.granularity and --stages, train/modes.h):
//   fused     one compiled function per step per device (fused_step) on a dp x tp slice;
//   chained   one traced program per step: the plan's units, one node each, the dp AllReduce
//             nodes and the update (with --moe-routing controller cut at every routing: segmented.h);
//   opbyop    the same nodes, each its own program (Pathways only: one client round trip each);
//   replicas  --replicas R slices, one per island, exchanging gradient pieces as program edges;
//   pipeline  --stages S slices of dp x tp devices each, consecutive layers per stage,
//             --microbatches M in GPipe or 1F1B node order.
// The programs are traced from the step plan (model/step_plan.h) by programs/trace.h,
// programs/replicas.h and programs/pipeline.h; the kernels they name are in programs/kernels.h,
// registered under a KernelNames prefix on every rank. Parameters and optimizer state stay on the
// devices across steps (each step's program consumes the state arrays and returns the next
// ones); the trainer fetches only the per-step statistics, the validation loss and the weights
// hash. The schedule of the run (evaluations, checkpoints, hooks) is the shared loop's (train/loop.h).
//
// Which processes call: the backend's (the controller; every rank of the static model, each
// call collective). Blocking: as the runtime's (a controller waits only for the fetches).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dataflow/builder.h"
#include "mpmd/backend.h"
#include "mpmd/segmented.h"
#include "programs/kernels.h"
#include "programs/step_io.h"
#include "train/config.h"
#include "train/loop.h"
#include "train/report.h"

namespace pwm::mpmd {

// The run's name in its log lines and metrics: "<model>-<granularity>" or "<model>-pipeline-<schedule>".
std::string run_name(const train::TrainConfig& cfg, Model model);

class Trainer final : public train::Trainer {
 public:
  // Places the slices (replica r's stage s is slice r S + s; with --expert-island one slice of
  // one device per expert-parallel rank after them), initializes the state (or, with `resume`,
  // loads the checkpoint already validated by train::load_resume_checkpoint), probes the GEMM
  // peak (unless --peak-gflops: train/peak.h) and builds the step program.
  Trainer(const train::TrainConfig& cfg, Backend& backend, bool resume, const programs::KernelNames& names = {});
  ~Trainer() override;
  // --spare-workers with no spare left for a replica's slice: this process's kernel shapes go to
  // a run of fewer replicas with it (programs::DeviceSet::set_replicas).
  void on_fewer_replicas(std::function<void(int)> reshape) { reshape_ = std::move(reshape); }

  // Trains through the shared run loop; returns the weights hash, or nullopt when a step was
  // non-finite beyond --skip-nonfinite (stop_error() says why; the metrics end with their
  // stopped line). Throws pwm::Error when an output cannot be written, a kernel failed or the
  // replicas diverged: the caller's error ends the job.
  std::optional<std::string> run();
  const std::string& stop_error() const { return stop_error_; }

  // train::Trainer.
  int64_t first_step() const override { return first_step_; }
  bool step(int64_t step) override;
  bool drain() override;
  void pause() override { last_end_us_ = -1; }
  void probe_peak() override;
  double evaluate() override;
  bool save(int64_t steps_done) override;
  // The bubble, the layout and memory figures, before the final evaluation's whole-model buffers
  // exist, as spmd_train's.
  void before_final() override { report_layout_and_memory(); }
  std::optional<std::string> finish() override;
  void fail() override { stop_error_ = report_->stop(); }
  train::TrainReport& report() override { return *report_; }

 private:
  using ArrayState = programs::State<Array>;
  using ValueState = programs::State<dataflow::Value>;
  struct Pending {  // a step in flight
    int64_t step;
    std::vector<Array> stats;        // per slice
    uint64_t round_trips;            // the controller's MoE routing round trips (runtime-counted puts)
    std::vector<ArrayState> inputs;  // --spare-workers: the state it started from (recover())
  };

  // ---- programs (trainer.cc) ----
  void place_slices();
  std::vector<int> all_slices() const;  // the step's slices, then the experts' devices
  std::vector<Array> state_inputs() const;  // every slice's state, then the experts' devices'
  std::vector<Array> donated_state();       // the same, moved out for the step (run_step)
  std::vector<ValueState> state_params(dataflow::Builder& b, std::vector<ValueState>* experts = nullptr) const;
  dataflow::ExecutablePtr cached(const std::string& key, const std::function<dataflow::ProgramDef()>& build);
  // `kernel` on every slice of `slices` (attrs(j) for the j-th), no inputs; its outputs in order.
  std::vector<Array> on_slices(const std::string& kernel, const std::vector<int>& slices,
                               const std::function<std::vector<int64_t>(size_t)>& attrs, const std::string& what);
  enum class Init { kSlices, kExperts, kRecovery };  // whose state: the step's slices, the experts' devices, a recovery's
  std::vector<ArrayState> init_states(const std::vector<int>& slices, bool load, Init what);
  dataflow::ProgramDef step_program() const;  // by mode
  std::string step_name() const;
  bool step_is_one_program() const;  // false: opbyop, or chained with --moe-routing controller
  bool controller_routing() const;   // --moe-routing controller
  Array route(const Array& counts);                // an MoE layer's counts fetched, the matrix put back
  Array island_route(const Array& counts, int j);  // --expert-island: experts' device j's counts
  std::vector<Array> run_step();
  dataflow::Value merged(dataflow::Builder& b, const std::vector<ValueState>& st, const std::vector<ValueState>& experts,
                         dataflow::Value ValueState::*which, int replica) const;
  std::string hash_of(int replica);
  double probe(double budget_s);  // the gemm_probe kernel on every slice at once: the mean rate

  // ---- steps (trainer.cc) ----
  // Dispatches step `step` and, with `record`, queues its statistics for drain_one.
  void launch(int64_t step, bool record = true);
  bool drain_one();  // false: the report stopped the run (a non-finite step)
  void report_layout_and_memory();
  void write_trace();

  // ---- recovery (recovery.cc; --spare-workers, Pathways) ----
  // After a fetch failed with `why`, when a slice lost its device (the runtime remapped it onto
  // a spare): the state rolls back to the oldest step in flight, the remapped slices get it from
  // a healthy replica (else every slice from the newest checkpoint of this run, or from the
  // start, with the steps since replayed), and the steps in flight run again. False: no slice
  // moved, the failure is another (the caller rethrows).
  bool recover(const std::string& why);
  ArrayState copy_state(const ArrayState& from, int to);  // a replica's state onto slice `to`
  // For each moved slice, a healthy slice of the same pipeline stage (of another replica) to copy
  // its state from; nullopt when one has none (the state then comes from the checkpoint).
  std::optional<std::vector<size_t>> same_stage(const std::vector<size_t>& moved, const std::vector<size_t>& healthy) const;
  // Drops the replicas whose slice is lost from the slices and from `st` (their states), and
  // goes on with the others on the same global batch; returns what it did, in words.
  std::string drop_lost_replicas(std::vector<ArrayState>& st, const std::string& why);

  train::TrainConfig cfg_;
  Backend& be_;
  dataflow::Runtime& rt_;
  programs::KernelNames names_;
  bool pipe_;
  int R_, S_, devices_;  // replicas, slices per replica (stages), devices per slice
  programs::Shapes sh_;
  std::unique_ptr<train::TrainReport> report_;  // made once the start-up peak is known
  std::vector<int> slices_;  // the runtime's; replica-major: slices_[r S + s] is replica r's stage s
  std::vector<ArrayState> states_;
  std::vector<int> expert_slices_;  // --expert-island: one slice of one device per expert-parallel rank
  std::vector<ArrayState> expert_states_;
  int64_t first_step_ = 0;
  std::map<std::string, dataflow::ExecutablePtr> programs_;  // built and loaded once each (until a recovery)
  dataflow::ExecutablePtr step_;  // null when the step is not one program
  std::unique_ptr<SegmentedStep> segmented_;  // chained with --moe-routing controller
  // --fsdp at chained and opbyop: the most bytes of gathered weights and gradient arrays the
  // step's program holds on a device at once (Grads::fsdp_held), set when the step is traced.
  mutable int64_t fsdp_program_held_ = 0;
  std::optional<uint64_t> puts_;  // MoE: the runtime's count of puts at the end of the previous step
  std::deque<Pending> pending_;
  double last_end_us_ = -1;  // the previous step's end on the devices' clock; -1 after a pause
  std::vector<double> bubbles_, exposed_, tails_;
  // --spare-workers: each slice's devices when its state was last made whole; the step of this
  // run's newest checkpoint (-1: none; recover() replays from it); per recovery, its seconds and
  // the steps it ran again; the replicas dropped for want of a spare, and the shapes' hook for it.
  std::vector<std::vector<int>> slice_devices_;
  int64_t saved_step_ = -1;
  std::vector<double> recovery_s_, recovery_steps_;
  int replicas_dropped_ = 0;
  std::function<void(int)> reshape_;
  std::string stop_error_;
};

}  // namespace pwm::mpmd
