// The SPMD / BSP trainer: every rank runs this same loop over a replicas x dp x tp mesh (tp ranks
// adjacent; train/config.h).
//
// One step: the step plan (model/step_plan.h) executed directly: forward and backward over the
// rank's micro-batches (gradient accumulation, train::accumulate_gradients), the tp reductions inside each block through the tp group's
// communicator, the bucketed dp AllReduce of the gradient buffer overlapped with the last
// micro-batch's backward (collectives::BucketedAllreduce), global-
// norm clipping (the squared norm reduced over tp), AdamW. Parameters, gradients and moments are
// this rank's tp shard in one contiguous buffer each (model/params.h); dp replicas stay
// bitwise identical because they apply the same update to the same reduced gradient.
// With replicas, the gradient is summed over every data-parallel rank: --replica-reduce flat is
// one AllReduce over all of them (same tp index), hierarchical a ReduceScatter inside the
// replica's dp group, an AllReduce of each shard across the replicas, an AllGather inside
// (collectives::BucketedAllreduce's two-level form). With --fsdp the dp axis shards parameters,
// gradients and moments instead (train/fsdp.h).
//
// Which ranks must call: every world rank constructs a Trainer and calls run(), collectively.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/bucketed_allreduce.h"
#include "collectives/communicator.h"
#include "common/trace.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "model/step_plan.h"
#include "train/bootstrap.h"
#include "train/config.h"
#include "train/loop.h"
#include "train/report.h"
#include "model/transformer.h"
#include "train/fsdp.h"

namespace pwm::spmd {

struct Mesh {
  int replicas = 1, dp = 1, tp = 1, ep = 1;
  int replica = 0, dp_rank = 0, tp_rank = 0;
  int ep_rank = 0;     // dp_rank % ep: which experts this rank holds
  int data_index = 0;  // replica * dp + dp_rank: the rank's index among all data-parallel ranks
  // World ranks: the tp group; the replica's dp group (same tp index); the replica group (same
  // dp and tp index in every replica); every data-parallel rank with the same tp index; the
  // expert-parallel group (the ep consecutive dp ranks of the replica this rank is in, same tp
  // index); the expert group (every data-parallel rank with this ep_rank: the same experts).
  std::vector<int> tp_group, dp_group, replica_group, flat_group, ep_group, expert_group;
  static Mesh make(int world_rank, int replicas, int dp, int tp, int ep = 1);
};

// What spmd_train's start-up checks (train/bootstrap.h): every rank computes.
train::TrainerSpec trainer_spec();
// One line naming the replicas whose ranks are on more than one host (their dp and tp
// collectives then cross hosts too, not only the replica exchange); empty if none.
std::string replicas_spanning_hosts(const train::TrainConfig& cfg, const std::vector<std::string>& hosts);

class Trainer final : public train::Trainer {
 public:
  // Validates nothing: the caller ran cfg.validate(), opened the dataset and loaded the resume
  // checkpoint (train::load_resume_checkpoint) on every rank. `peak`: the start-up GEMM peak
  // (train::gemm_peak); `probe`: this rank's, which probe_peak runs again (null with --peak-gflops).
  Trainer(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport,
          const train::TextDataset& data, train::Peak peak, std::unique_ptr<model::GemmProbe> probe,
          const std::optional<train::Checkpoint>& resume_from);
  ~Trainer() override;

  // Trains from the checkpoint's step (when resuming) to cfg.workload.steps through the shared
  // run loop (train/loop.h); writes metrics, trace and checkpoints as configured. Returns the hex
  // weights hash, or nullopt when an output could not be written or a step was non-finite
  // beyond --skip-nonfinite: rank 0 has then printed one line ("spmd_train: error: ...") and
  // every rank stopped at the same step (an output failure travels with the step's statistics,
  // a non-finite loss or norm is the same on every rank after the step's reductions); no output
  // is left half-written (a non-finite stop keeps the metrics up to the step before, and the last
  // checkpoint).
  std::optional<std::string> run();

  // train::Trainer: every call is collective over the world.
  int64_t first_step() const override { return first_step_; }
  void start() override;
  bool step(int64_t step) override;
  void pause() override { last_end_us_ = -1; }
  void probe_peak() override;
  double evaluate() override;
  bool save(int64_t steps_done) override;
  void before_final() override;
  std::optional<std::string> finish() override;
  void fail() override;
  train::TrainReport& report() override { return report_; }

 private:
  double train_step(int64_t step, train::StepRecord& rec);
  void save_checkpoint(int64_t steps_done);
  // Runs an output write `fn` (on whichever ranks it writes) and agrees on its outcome on every
  // rank; false (one line printed by rank 0) if it failed anywhere.
  bool agreed_write(const std::function<void()>& fn);
  std::vector<train::TensorData> full(const float* buffer);
  void make_reducers();          // reducer_ (and expert_reducer_): the gradient's sums
  void make_expert_comm();       // expert_comm_fn_ over ep_comm_
  // The step's MoE record: this rank's statistics summed over the data-parallel ranks.
  train::MoeRecord moe_record(const model::MoeStats& mine, const std::vector<double>& alltoall_ms);
  // A full tp-layout buffer from params_/m_/v_ (gathered over dp with --fsdp; else a copy of the
  // pointer). Collective over dp with --fsdp.
  const float* unsharded(const float* buffer, std::vector<float>& storage);
  int64_t state_bytes() const;  // parameters, gradients, moments and gathered buffers held

  train::TrainConfig cfg_;
  std::shared_ptr<collectives::Transport> transport_;
  const train::TextDataset& data_;
  Mesh mesh_;
  collectives::Communicator world_, tp_comm_, dp_comm_, replica_comm_, flat_comm_;
  collectives::Communicator dp_gather_comm_;  // the dp group again: the hierarchical exchange's all-gathers
  collectives::Communicator ep_comm_, expert_comm_;  // --expert-parallel: the AllToAll group, the experts' reduction
  model::ParamLayout layout_;
  model::StepPlan plan_;  // the step's units and gradient ranges (model/step_plan.h)
  std::vector<float> params_, grads_, m_, v_;
  model::Workspace<float> ws_;
  std::vector<int32_t> tokens_;
  Trace trace_;
  std::unique_ptr<collectives::BucketedAllreduce> reducer_;  // without --fsdp
  // --expert-parallel: the experts' gradient ranges, summed over expert_comm_ as the backward
  // finishes them (expert_of_: finish range -> index in its units, -1 none).
  std::unique_ptr<collectives::BucketedAllreduce> expert_reducer_;
  std::vector<int> expert_of_;
  model::ExpertComm<float> expert_comm_fn_;  // the model's view of ep_comm_ (size 1: none)
  double alltoall_s_ = 0;                     // time inside the expert AllToAlls this step
  std::unique_ptr<train::Fsdp> fsdp_;                                  // with --fsdp: params_... are shards
  train::TrainReport report_;
  std::unique_ptr<model::GemmProbe> probe_;  // this rank's GEMM peak probe (null: --peak-gflops)
  train::StepRecord rec_;
  model::TpReduce<float> tp_reduce_;
  double comm_s_ = 0;  // tp reductions and scalar reductions of the current step
  // When the previous step ended (after its closing barrier), or -1 after a pause (evaluation,
  // checkpoint): a step's time runs from there, so that what happens between two steps (the
  // statistics' allgather, the report) is charged to a step, as pathways_train's step times are
  // (from one step's end to the next on the workers' clock).
  int64_t last_end_us_ = -1;
  int64_t first_step_ = 0;
  bool output_failed_ = false;  // some rank's report failed to write (learned with the last step)
};

}  // namespace pwm::spmd
