// pathways_train's controller side: the training step as Pathways programs, one builder per mode
// (cfg.mpmd.granularity and --stages, train/modes.h):
//   fused     one compiled function per step per device (pw_fused_step) on a dp x tp slice;
//   chained   one traced program per step: per micro-batch a batch node, embed, L block forward
//             nodes, the head, L block backward nodes and the embedding backward; then one dp
//             AllReduce node per gradient piece and an update node, dispatched at once;
//   opbyop    the same nodes, each its own program (one client round trip each);
//   replicas  --replicas R slices, one per island, exchanging gradient pieces as program edges;
//   pipeline  --stages S slices of dp x tp devices each, spread over the islands, consecutive
//             layers per stage, --microbatches M in GPipe or 1F1B node order; activations and
//             their gradients flow stage to stage, worker to worker.
// The programs are traced from the step plan (model/step_plan.h) by programs/trace.h and
// programs/pipeline.h (over this runtime's slices: step_program.h); the kernels they name are in
// programs/kernels.h, registered under a KernelNames prefix.
// Parameters and optimizer state stay in the workers' object stores across steps (each step's
// program consumes the state arrays and returns the next ones); the controller fetches only the
// per-step statistics (loss, gradient norm, timings), the validation loss and the weights hash.
// The schedule of the run (evaluations, checkpoints, hooks) is the shared loop's (train/loop.h).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/trace.h"
#include "pathways/client.h"
#include "pathways/train/programs.h"
#include "pathways/train/step_program.h"
#include "train/bootstrap.h"
#include "train/config.h"
#include "train/loop.h"
#include "train/report.h"

namespace pwm::pathways::train {

// What pathways_train's start-up checks (train/bootstrap.h): world rank 0 is the controller,
// the others are the devices of the slices (dp x tp, times --stages, times --replicas).
pwm::train::TrainerSpec trainer_spec();

// The run's name in its log lines and metrics: "pathways-<granularity>" or "pathways-pipeline-<schedule>".
std::string run_name(const pwm::train::TrainConfig& cfg);

// The controller's whole run (world rank 0; the other ranks serve as workers, pathways::run_worker):
// the runtime over the workers (islands and liveness from `cfg`), the header line, the training,
// the runtime's shutdown. Blocks until the training ends. Returns "" or, when the run stopped at
// a non-finite step (--skip-nonfinite), the one line saying why, with the workers released: the
// caller prints it once and every rank exits non-zero (main.cc). `lost` gets the workers lost
// on the way (--spare-workers), which the job's last agreement leaves out.
// `reshape`: this process's kernel shapes to a run with that many replicas (DeviceSet::set_replicas:
// the kernels' signatures), called when the run goes on with fewer replicas (Trainer::recover).
std::string run_controller(std::shared_ptr<collectives::Transport> transport, const pwm::train::TrainConfig& cfg,
                           bool resume, std::vector<int>* lost = nullptr, std::function<void(int)> reshape = {});

// Runs on world rank 0 (the controller) only; every call blocks until the programs it
// dispatches have been accepted, and the statistics' fetches until the step has run.
class Trainer final : public pwm::train::Trainer {
 public:
  // Places the slices through `client`, initializes the state on the workers (or, with `resume`,
  // loads the checkpoint already validated by train::load_resume_checkpoint) and builds the step
  // program. The kernels must be registered under `names` (programs/kernels.h) on every rank. The GEMM
  // peak (train/peak.h): --peak-gflops, else every worker probes its step's products now (the
  // gemm_probe kernel on every slice at once) and again at every probe_peak.
  Trainer(const pwm::train::TrainConfig& cfg, Client& client, int num_islands, bool resume,
          const KernelNames& names = {});
  ~Trainer() override;
  // --spare-workers with no spare left for a replica's slice: this process's kernel shapes go to
  // a run of fewer replicas with it (run_controller's `reshape`).
  void on_fewer_replicas(std::function<void(int)> reshape) { reshape_ = std::move(reshape); }

  // Trains through the shared run loop; returns the weights hash, or nullopt when a step was
  // non-finite beyond --skip-nonfinite (stop_error() says why; the metrics end with their
  // stopped line). Throws pwm::Error when an output cannot be written or the replicas diverged:
  // the controller's error ends the job.
  std::optional<std::string> run();
  const std::string& stop_error() const { return stop_error_; }

  // pwm::train::Trainer.
  int64_t first_step() const override { return first_step_; }
  bool step(int64_t step) override;
  bool drain() override;
  void pause() override { last_end_us_ = -1; }
  void probe_peak() override;  // the gemm_probe kernel on every slice at once
  double evaluate() override;
  bool save(int64_t steps_done) override;
  // The bubble, the layout and memory figures (peak resident set, state), before the final
  // evaluation's whole-model buffers exist, as spmd_train's.
  void before_final() override { report_layout_and_memory(); }
  std::optional<std::string> finish() override;
  void fail() override;  // (only a non-finite stop: a failed write throws)
  pwm::train::TrainReport& report() override { return *report_; }

 private:
  using ArrayState = State<Array>;
  struct Pending {  // a step in flight
    int64_t step;
    std::vector<Array> stats;  // per slice
    uint64_t round_trips;      // the controller's MoE routing round trips (runtime-counted puts)
    std::vector<ArrayState> inputs;  // --spare-workers: the state it started from (recover())
  };

  void place_slices(int num_islands);
  std::vector<Slice> all_slices() const;  // the step's slices, then the experts' devices
  double probe_workers(double budget_s);  // the gemm_probe kernel on every slice: the mean rate
  Program build_step_program() const;  // by mode; empty for opbyop (no program: a call per node)
  Program chained_program() const;
  bool controller_routing() const;  // --moe-routing controller
  Array route(const Array& counts);  // fetch an MoE layer's counts, put the matrix back
  Array island_route(const Array& counts, int j);  // --expert-island: experts' device j's counts
  std::vector<Array> run_step();
  // Dispatches step `step` and, with `record`, queues its statistics for drain_one.
  void launch(int64_t step, bool record = true);
  // --spare-workers: after a fetch failed with `why`, when a slice lost its device (the runtime
  // remapped it onto a spare): the state rolls back to the oldest step in flight, the remapped
  // slices get it from a healthy replica (else every slice from the newest checkpoint of this
  // run, or from the start, with the steps since replayed), and the steps in flight run again.
  // False: no slice moved, the failure is another (the caller rethrows).
  bool recover(const std::string& why);
  ArrayState copy_state(const ArrayState& from, const Slice& to);  // a replica's state onto `to`
  // For each moved slice, a healthy slice of the same pipeline stage (of another replica) to copy
  // its state from; nullopt when one has none (the state then comes from the checkpoint).
  std::optional<std::vector<size_t>> same_stage(const std::vector<size_t>& moved, const std::vector<size_t>& healthy) const;
  std::vector<Array> dispatch(const Program& p, const std::vector<Array>& in, const std::string& what);
  std::vector<double> fetch(const Array& a, const std::string& what);
  // A one-node program of `kernel` on slice `s`.
  Program single(const std::string& kernel, const Slice& s, const std::vector<Array>& in, std::vector<int64_t> attrs) const;
  Array merged(Array ArrayState::*which, int replica = 0);  // a pipeline's stages merged
  std::string hash_of(int replica);
  bool drain_one();  // false: the report stopped the run (a non-finite step)
  void record_overlap(const std::vector<StepStats>& devices);
  void report_layout_and_memory();
  void write_trace();

  pwm::train::TrainConfig cfg_;
  Client& client_;
  KernelNames names_;
  bool pipe_;
  int R_, S_, devices_;  // replicas, slices per replica (stages), devices per slice
  Shapes sh_;
  std::unique_ptr<pwm::train::TrainReport> report_;  // made once the start-up peak is known
  Trace trace_;
  RunOptions ro_;
  std::vector<Slice> slices_;  // replica-major: slice r x S + s is replica r's stage s
  std::vector<ArrayState> states_;
  // --expert-island: one slice of one device per expert-parallel rank, and its state.
  std::vector<Slice> expert_slices_;
  std::vector<ArrayState> expert_states_;
  template <typename V>
  ExpertIsland<V> island(const std::vector<State<V>>& states, std::function<std::vector<V>(const std::string&, const Slice&,
                                                                                        std::vector<V>, std::vector<int64_t>)>
                                                                  call) const;
  int64_t first_step_ = 0;
  Program step_prog_;
  std::unique_ptr<SegmentedStep> segmented_;  // chained with --moe-routing controller
  // --fsdp at chained and opbyop: the most bytes of gathered weights and gradient arrays the
  // step's program holds on a device at once (Grads::fsdp_held), set when the step is traced.
  mutable int64_t fsdp_program_held_ = 0;
  // MoE: the runtime's count of this client's puts at the end of the previous step (read once).
  std::optional<uint64_t> puts_;
  // Steps: two stay in flight while the controller reads the statistics of the one before.
  std::deque<Pending> pending_;
  double last_end_us_ = -1;  // the previous step's end on the workers' clock; -1 after a pause
  std::vector<double> bubbles_, exposed_, tails_;
  // --spare-workers: each slice's devices when its state was last made whole; the step of this
  // run's newest checkpoint (-1: none; recover() replays from it); per recovery, its seconds and
  // the steps it ran again.
  std::vector<std::vector<int>> slice_devices_;
  int64_t saved_step_ = -1;
  std::vector<double> recovery_s_, recovery_steps_;
  // Replicas dropped for want of a spare (drop_lost_replicas), and the shapes' hook for it.
  int replicas_dropped_ = 0;
  std::function<void(int)> reshape_;
  // Drops the replicas whose slice is lost from the slices and from `st` (their states), and
  // goes on with the others on the same global batch; returns what it did, in words.
  std::string drop_lost_replicas(std::vector<ArrayState>& st, const std::string& why);
  std::string stop_error_;
};

}  // namespace pwm::pathways::train
