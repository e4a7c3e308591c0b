#include "spmd/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "collectives/strings.h"
#include "common/check.h"
#include "common/memory.h"
#include "common/time.h"
#include "train/checkpoint.h"
#include "train/expert_comm.h"
#include "train/full_state.h"
#include "model/optim.h"
#include "train/step.h"

namespace pwm::spmd {

using collectives::Algorithm;
using collectives::Communicator;
using collectives::DataType;
using collectives::ReduceOp;

namespace {
// Context ids: world 0, tp groups 1, dp groups 2, replica groups 3, flat data-parallel groups 4,
// dp groups for the hierarchical exchange's all-gathers 5, expert-parallel groups 6, expert groups
// 7 (groups of one family are disjoint).
constexpr uint32_t kTpContext = 1, kDpContext = 2, kReplicaContext = 3, kFlatContext = 4, kDpGatherContext = 5,
                   kEpContext = 6, kExpertContext = 7;

collectives::CommOptions comm_options(const train::TrainConfig& cfg) {
  collectives::CommOptions o = collectives::CommOptions::from_env();
  o.timeout_s = cfg.exec.coll_timeout;
  return o;
}

}  // namespace

train::TrainerSpec trainer_spec() {
  train::TrainerSpec s;
  s.program = "spmd_train";
  s.description = "SPMD/BSP trainer: every rank runs the same step; gradients meet in a bucketed AllReduce.";
  s.validate = [](const train::TrainConfig& cfg, int world) { cfg.validate(world); };
  return s;
}

std::string replicas_spanning_hosts(const train::TrainConfig& cfg, const std::vector<std::string>& hosts) {
  const int per = cfg.mesh.dp * cfg.mesh.tp;
  std::vector<std::string> spans;
  for (int r = 0; r < cfg.mesh.replicas && (r + 1) * per <= static_cast<int>(hosts.size()); ++r) {
    std::vector<std::string> mine(hosts.begin() + r * per, hosts.begin() + (r + 1) * per);
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    if (mine.size() > 1) spans.push_back(fmt::format("replica {} ({})", r, fmt::join(mine, ", ")));
  }
  if (spans.empty()) return "";
  return fmt::format("[spmd] note: not on one host: {}; its dp/tp collectives cross hosts", fmt::join(spans, "; "));
}

Mesh Mesh::make(int world_rank, int replicas, int dp, int tp, int ep) {
  // World rank = (replica * dp + dp_rank) * tp + tp_rank (train/config.h).
  Mesh m;
  m.replicas = replicas;
  m.dp = dp;
  m.tp = tp;
  m.ep = ep;
  m.data_index = world_rank / tp;
  m.tp_rank = world_rank % tp;
  m.replica = m.data_index / dp;
  m.dp_rank = m.data_index % dp;
  for (int t = 0; t < tp; ++t) m.tp_group.push_back(m.data_index * tp + t);
  for (int d = 0; d < dp; ++d) m.dp_group.push_back((m.replica * dp + d) * tp + m.tp_rank);
  for (int r = 0; r < replicas; ++r) m.replica_group.push_back((r * dp + m.dp_rank) * tp + m.tp_rank);
  for (int i = 0; i < replicas * dp; ++i) m.flat_group.push_back(i * tp + m.tp_rank);
  // Expert parallelism: ep divides dp (TrainConfig::validate), so a group never leaves its replica.
  m.ep_rank = m.dp_rank % ep;
  for (int j = 0; j < ep; ++j) m.ep_group.push_back((m.data_index - m.ep_rank + j) * tp + m.tp_rank);
  for (int i = m.ep_rank; i < replicas * dp; i += ep) m.expert_group.push_back(i * tp + m.tp_rank);
  return m;
}

Trainer::Trainer(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport,
                 const train::TextDataset& data, train::Peak peak, std::unique_ptr<model::GemmProbe> probe,
                 const std::optional<train::Checkpoint>& resume_from)
    : cfg_(cfg), transport_(transport), data_(data),
      mesh_(Mesh::make(transport->rank(), cfg.mesh.replicas, cfg.mesh.dp, cfg.mesh.tp, cfg.mesh.ep)),
      world_(Communicator::world(transport, comm_options(cfg))),
      tp_comm_(transport, mesh_.tp_group, kTpContext, comm_options(cfg)),
      dp_comm_(transport, mesh_.dp_group, kDpContext, comm_options(cfg)),
      replica_comm_(transport, mesh_.replica_group, kReplicaContext, comm_options(cfg)),
      flat_comm_(transport, mesh_.flat_group, kFlatContext, comm_options(cfg)),
      dp_gather_comm_(transport, mesh_.dp_group, kDpGatherContext, comm_options(cfg)),
      ep_comm_(transport, mesh_.ep_group, kEpContext, comm_options(cfg)),
      expert_comm_(transport, mesh_.expert_group, kExpertContext, comm_options(cfg)),
      layout_(cfg.model, mesh_.tp_rank, cfg.mesh.tp, mesh_.ep_rank, cfg.mesh.ep),
      plan_(layout_, cfg.workload.microbatches),
      ws_(layout_, cfg.micro_batch()),
      tokens_(static_cast<size_t>(cfg.micro_batch() * (cfg.model.seq_len + 1))),
      trace_(!cfg.outputs.trace.empty(), transport->rank(), 0),
      report_(cfg, "spmd", transport->size(), std::move(peak), transport->rank() == 0), probe_(std::move(probe)) {
  // The state is allocated here, at its size (a shard with --fsdp): never a full buffer first,
  // which the peak resident bytes would count.
  if (cfg_.mesh.fsdp) {
    fsdp_ = std::make_unique<train::Fsdp>(cfg_, layout_, plan_, &dp_comm_, &replica_comm_);
    PWM_CHECK_EQ(fsdp_->shard_total(), train::Fsdp::shard_total(layout_, cfg_.mesh.dp));
  }
  const size_t n = static_cast<size_t>(fsdp_ ? fsdp_->shard_total() : layout_.total());
  params_.assign(n, 0.0f);
  grads_.assign(n, 0.0f);
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
  // From full tensors to this rank's buffer (through one full tp buffer with --fsdp).
  auto load = [&](const std::vector<train::TensorData>* full, float* dst) {
    if (!fsdp_) {
      if (full) train::scatter_full(layout_, *full, dst);
      else model::init_params(layout_, cfg_.model.seed, dst);
      return;
    }
    std::vector<float> tmp(static_cast<size_t>(layout_.total()));
    if (full) train::scatter_full(layout_, *full, tmp.data());
    else model::init_params(layout_, cfg_.model.seed, tmp.data());
    fsdp_->take_shard(tmp.data(), dst);
  };
  if (resume_from) {
    load(&resume_from->params, params_.data());
    load(&resume_from->adam_m, m_.data());
    load(&resume_from->adam_v, v_.data());
    first_step_ = resume_from->step;
    if (transport->rank() == 0) fmt::print("[spmd] resumed from {} at step {}\n", cfg_.outputs.ckpt, first_step_);
  } else {
    load(nullptr, params_.data());
    if (cfg_.outputs.resume && transport->rank() == 0)
      fmt::print("[spmd] --resume: no checkpoint at {} yet, starting from step 0\n", cfg_.outputs.ckpt);
  }
  make_reducers();
  make_expert_comm();
  if (cfg_.mesh.tp > 1) {
    tp_reduce_ = [this](float* d, size_t n) {
      const int64_t t0 = now_us();
      tp_comm_.allreduce(d, d, n, DataType::kFloat32, ReduceOp::kSum);
      const int64_t t1 = now_us();
      comm_s_ += (t1 - t0) * 1e-6;
      trace_.span("tp allreduce", "comm", t0, t1, 0);
    };
  }
  trace_.process_name(fmt::format("rank {} (replica {}, dp {}, tp {})", transport->rank(), mesh_.replica, mesh_.dp_rank, mesh_.tp_rank));
  trace_.thread_name(0, "compute");
  trace_.thread_name(1, "dp allreduce");
}

Trainer::~Trainer() = default;

void Trainer::make_reducers() {
  auto on_bucket = [this](int i, int64_t t0, int64_t t1, size_t bytes) {
    trace_.span(fmt::format("allreduce bucket {}", i), "comm", t0, t1, 1, fmt::format(R"({{"bytes":{}}})", bytes));
  };
  if (fsdp_) return;  // reduced inside Fsdp::accumulate
  // With expert parallelism the experts' ranges are summed over the ranks holding the same
  // experts only; the dense ranges around them as without.
  std::vector<collectives::BucketedAllreduce::Range> units = plan_.finish_order();
  if (cfg_.mesh.ep > 1) {
    train::ExpertSplit split = train::split_experts(layout_, units);
    units = split.dense;
    expert_of_ = split.expert_of;
    expert_reducer_ = std::make_unique<collectives::BucketedAllreduce>(&expert_comm_, split.experts, cfg_.exec.bucket_bytes,
                                                                       cfg_.exec.overlap, on_bucket);
  }
  // The gradient's sum over every data-parallel rank: inside the one replica; over all of them
  // at once (flat); or in two levels, the replicas exchanging 1/dp of it each (hierarchical).
  if (cfg_.mesh.replicas == 1) {
    reducer_ = std::make_unique<collectives::BucketedAllreduce>(&dp_comm_, units, cfg_.exec.bucket_bytes,
                                                                cfg_.exec.overlap, on_bucket);
  } else if (cfg_.exec.replica_reduce == train::ReplicaReduce::kFlat) {
    reducer_ = std::make_unique<collectives::BucketedAllreduce>(&flat_comm_, units, cfg_.exec.bucket_bytes,
                                                                cfg_.exec.overlap, on_bucket);
  } else {
    reducer_ = std::make_unique<collectives::BucketedAllreduce>(&dp_comm_, &dp_gather_comm_, &replica_comm_, units,
                                                                cfg_.exec.bucket_bytes, cfg_.exec.overlap, on_bucket);
  }
}

void Trainer::make_expert_comm() {
  // Its AllToAlls' time is the step's AllToAll time (alltoall_s_, outside comm_s_).
  expert_comm_fn_ = train::expert_alltoall(cfg_.mesh.ep > 1 ? &ep_comm_ : nullptr, {&alltoall_s_}, &trace_);
}

train::MoeRecord Trainer::moe_record(const model::MoeStats& mine, const std::vector<double>& alltoall_ms) {
  std::vector<double> v = train::pack_moe_stats(mine, cfg_.model.experts);
  if (cfg_.data_parallel() > 1)
    flat_comm_.allreduce(v.data(), v.data(), v.size(), DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  train::MoeRecord r = train::moe_record(v, cfg_);
  r.alltoall_ms = alltoall_ms;
  return r;
}

std::vector<train::TensorData> Trainer::full(const float* buffer) {
  return train::gather_full(
      layout_, buffer, [this](const float* shard, float* out, size_t n) { tp_comm_.allgather(shard, out, n, DataType::kFloat32); },
      [this](const float* shard, float* out, size_t n) { ep_comm_.allgather(shard, out, n, DataType::kFloat32); });
}

const float* Trainer::unsharded(const float* buffer, std::vector<float>& storage) {
  if (!fsdp_) return buffer;
  storage.resize(static_cast<size_t>(layout_.total()));
  fsdp_->gather_full(buffer, storage.data());
  return storage.data();
}

int64_t Trainer::state_bytes() const {
  const int64_t state = static_cast<int64_t>(4 * params_.size() * sizeof(float));
  return state + (fsdp_ ? fsdp_->peak_gathered_bytes() : 0);
}

void Trainer::save_checkpoint(int64_t steps_done) {
  // One tp group holds a full replica (with --fsdp: once replica 0's dp group has gathered its
  // shards); its members gather over tp, world rank 0 writes. The file holds whole tensors,
  // whatever the mesh.
  if (mesh_.replica != 0) return;
  std::vector<float> sp, sm, sv;
  const float* p = unsharded(params_.data(), sp);
  const float* m = unsharded(m_.data(), sm);
  const float* v = unsharded(v_.data(), sv);
  if (mesh_.dp_rank >= cfg_.mesh.ep) return;  // the first expert-parallel group holds every expert
  const int64_t t0 = now_us();
  train::Checkpoint ck;
  ck.config = cfg_.model;
  ck.step = steps_done;
  ck.train_config_json = cfg_.workload_json();
  ck.params = full(p);
  ck.adam_m = full(m);
  ck.adam_v = full(v);
  if (transport_->rank() == 0) train::save_checkpoint(cfg_.outputs.ckpt, ck);
  trace_.span("checkpoint", "io", t0, now_us());
}

double Trainer::evaluate() {
  double sum = fsdp_ ? fsdp_->validation_loss_sum(data_, mesh_.data_index, params_.data(), ws_, tokens_.data(), tp_reduce_)
                     : train::validation_loss_sum(cfg_, layout_, data_, mesh_.data_index, params_.data(), ws_,
                                                  tokens_.data(), tp_reduce_, expert_comm_fn_);
  if (cfg_.data_parallel() > 1)
    flat_comm_.allreduce(&sum, &sum, 1, DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  return sum / static_cast<double>(train::validation_batches(cfg_, data_) * cfg_.workload.global_batch);
}

double Trainer::train_step(int64_t step, train::StepRecord& rec) {
  comm_s_ = 0;
  alltoall_s_ = 0;
  const int64_t step_t0 = now_us();
  if (cfg_.hooks.straggles(transport_->rank()))  // (counted as this rank's compute, as a slower device's)
    std::this_thread::sleep_for(std::chrono::milliseconds(cfg_.hooks.straggler_ms));
  train::StepHooks hooks;
  hooks.tp_reduce = tp_reduce_;
  hooks.ep = expert_comm_fn_;
  model::MoeStats moe_stats;
  hooks.moe = &moe_stats;
  if (reducer_) {
    reducer_->begin(grads_.data());
    if (expert_reducer_) expert_reducer_->begin(grads_.data());
    hooks.unit_done = [this](int u) {
      reducer_->unit_done(u);
      if (expert_reducer_ && expert_of_[static_cast<size_t>(u)] >= 0) expert_reducer_->unit_done(expert_of_[static_cast<size_t>(u)]);
    };
  }
  hooks.span = [this](const char* name, int64_t t0, int64_t t1) { trace_.span(name, "compute", t0, t1); };
  if (cfg_.hooks.kill_now(step, transport_->rank())) hooks.after_forward = [this](int64_t) { cfg_.hooks.kill_self(); };
  double local_loss = 0;
  if (fsdp_) {
    local_loss = fsdp_->accumulate(data_, step, mesh_.data_index, params_.data(), grads_.data(), ws_, tokens_.data(), hooks);
  } else {
    local_loss = train::accumulate_gradients(cfg_, layout_, plan_, data_, step, mesh_.data_index, params_.data(),
                                             grads_.data(), ws_, tokens_.data(), hooks);
    reducer_->finish();
    if (expert_reducer_) expert_reducer_->finish();
  }
  const int64_t t_opt = now_us();
  // Loss of the global batch; squared gradient norm over the tp shards (grads are identical on
  // every dp rank after the reduction) and, with --fsdp, over the dp shards; with expert
  // parallelism the dense part (the same everywhere) plus the experts' summed over the group.
  double red[2] = {local_loss, 0.0};
  if (fsdp_) {
    red[1] = fsdp_->grad_sq_norm(grads_.data());
  } else if (cfg_.mesh.ep == 1) {
    red[1] = model::grad_sq_norm_tp(layout_, grads_.data());
  } else {
    double experts = model::grad_sq_norm_tp(layout_, grads_.data(), model::NormPart::kExperts);
    const int64_t te = now_us();
    ep_comm_.allreduce(&experts, &experts, 1, DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
    comm_s_ += (now_us() - te) * 1e-6;
    red[1] = model::grad_sq_norm_tp(layout_, grads_.data(), model::NormPart::kDense) + experts;
  }
  const int64_t tr0 = now_us();
  if (cfg_.mesh.tp > 1) tp_comm_.allreduce(&red[1], &red[1], 1, DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  if (fsdp_) dp_comm_.allreduce(&red[1], &red[1], 1, DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  if (cfg_.data_parallel() > 1)
    flat_comm_.allreduce(&red[0], &red[0], 1, DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  comm_s_ += (now_us() - tr0) * 1e-6;
  double loss = red[0] / cfg_.data_parallel();
  // A non-finite loss or gradient norm (the same global values on every rank): no update, the
  // step counted as taken; the report decides whether the run goes on (--skip-nonfinite).
  const bool skip = train::nonfinite_step(cfg_.hooks, step, &loss, &red[1]);
  train::UpdateResult upd;
  if (skip) {
    upd.lr = model::lr_at(cfg_.optim, step);
    upd.grad_norm = std::sqrt(red[1]);
  } else if (fsdp_) {
    upd.lr = model::lr_at(cfg_.optim, step);
    upd.grad_norm = std::sqrt(red[1]);
    fsdp_->adamw(step, upd.lr, model::clip_factor(cfg_.optim, red[1]), params_.data(), grads_.data(), m_.data(),
                 v_.data());
  } else {
    upd = train::apply_update(cfg_, layout_, step, red[1], params_.data(), grads_.data(), m_.data(), v_.data());
  }
  const int64_t t_end = now_us();
  trace_.span("optimizer", "compute", t_opt, t_end);
  // Straggler accounting: this rank's compute and communication, then how long it waits for
  // the slowest rank to finish the step.
  const double step_comm = comm_s_ + alltoall_s_ + (reducer_ ? reducer_->comm_seconds() : fsdp_->comm_seconds()) +
                           (expert_reducer_ ? expert_reducer_->comm_seconds() : 0.0);
  const double mine_compute = (t_end - step_t0) * 1e-6 - step_comm;
  const int64_t w0 = now_us();
  world_.barrier();
  const int64_t w1 = now_us();
  trace_.span("wait (step end)", "sync", w0, w1);
  // The 4th word: this rank's report has failed to write (a full disk), so that every rank learns
  // it with the statistics it already exchanges, and all stop together.
  double mine[5] = {mine_compute * 1e3, step_comm * 1e3, (w1 - w0) * 1e-3, report_.failed() ? 1.0 : 0.0,
                    alltoall_s_ * 1e3};
  std::vector<double> all(5 * world_.size());
  world_.allgather(mine, all.data(), 5, DataType::kFloat64);
  rec.step = step;
  rec.loss = loss;
  rec.lr = upd.lr;
  rec.grad_norm = upd.grad_norm;
  rec.step_ms = (w1 - (last_end_us_ >= 0 ? last_end_us_ : step_t0)) * 1e-3;
  last_end_us_ = w1;
  rec.compute_ms.clear();
  rec.comm_ms.clear();
  rec.wait_ms.clear();
  output_failed_ = false;
  std::vector<double> alltoall_ms;
  for (int r = 0; r < world_.size(); ++r) {
    rec.compute_ms.push_back(all[5 * r]);
    rec.comm_ms.push_back(all[5 * r + 1]);
    rec.wait_ms.push_back(all[5 * r + 2]);
    output_failed_ = output_failed_ || all[5 * r + 3] != 0;
    alltoall_ms.push_back(all[5 * r + 4]);
  }
  rec.moe.reset();
  if (cfg_.model.moe()) rec.moe = moe_record(moe_stats, alltoall_ms);
  return loss;
}

bool Trainer::agreed_write(const std::function<void()>& fn) {
  return collectives::agree_on_errors(world_, "spmd_train", fn);
}

std::optional<std::string> Trainer::run() { return train::run(*this, cfg_, transport_->rank()); }

void Trainer::start() {
  world_.barrier();
  // A common origin on every host's clock: rank 0's time after the barrier, which rank r's clock
  // reads as that plus r's offset to rank 0 (collectives/clock_sync.h); the rows then line up
  // across hosts whose monotonic clocks have unrelated origins.
  const int64_t offset = transport_->clock_offset_us(transport_->rank());
  int64_t origin = now_us() - offset;
  world_.broadcast(&origin, 1, collectives::DataType::kInt64, 0);
  trace_ = Trace(trace_.enabled(), transport_->rank(), origin + offset);
  trace_.process_name(fmt::format("rank {} (replica {}, dp {}, tp {})", transport_->rank(), mesh_.replica, mesh_.dp_rank, mesh_.tp_rank));
  trace_.thread_name(0, "compute");
  trace_.thread_name(1, "dp allreduce");
}

bool Trainer::step(int64_t step) {
  train_step(step, rec_);
  if (output_failed_) return false;  // a metrics write failed: reported by fail(), on every rank at once
  report_.step(rec_);
  return !report_.stopped();  // a non-finite step beyond --skip-nonfinite: the same verdict on every rank
}

void Trainer::probe_peak() {
  if (!probe_) return;  // --peak-gflops (the same on every rank)
  const int64_t t0 = now_us();
  report_.probed(train::probe_gemm_peak(world_, *probe_, train::kPeakProbeBudgetS));
  trace_.span("gemm peak probe", "compute", t0, now_us());
}

bool Trainer::save(int64_t steps_done) { return agreed_write([&] { save_checkpoint(steps_done); }); }

void Trainer::fail() {
  agreed_write([&] {
    if (report_.stopped()) throw Error(report_.stop());  // rank 0 ends the metrics with the stopped line
    if (report_.failed()) throw Error(report_.error());
    throw Error("another rank's output failed");
  });
}

void Trainer::before_final() {
  // Memory, measured before the final evaluation and checkpoint (whose whole-model buffers are
  // not training state): the process's peak resident set and the model state it holds.
  double mine[2] = {static_cast<double>(peak_resident_bytes()), static_cast<double>(state_bytes())};
  std::vector<double> all(2 * static_cast<size_t>(world_.size()));
  world_.allgather(mine, all.data(), 2, DataType::kFloat64);
  std::vector<double> peak, state;
  for (int r = 0; r < world_.size(); ++r) {
    peak.push_back(all[2 * r]);
    state.push_back(all[2 * r + 1]);
  }
  // Per rank, and the largest as pathways_train reports them (compare.sh's table reads those).
  report_.figures().peak_resident_bytes_per_rank = peak;
  report_.figures().state_bytes_per_rank = state;
  report_.figures().peak_rss_bytes = *std::max_element(peak.begin(), peak.end());
  report_.figures().state_bytes = *std::max_element(state.begin(), state.end());
  train::report_memory_estimate(cfg_, /*mpmd=*/false, report_.figures());
}

std::optional<std::string> Trainer::finish() {
  std::vector<float> sp;
  const std::string hash = train::hash_hex(train::weights_hash(full(unsharded(params_.data(), sp))));
  std::vector<std::string> fragments;
  if (!cfg_.outputs.trace.empty()) fragments = collectives::allgather_strings(world_, trace_.fragment());
  const bool ok = agreed_write([&] {
    if (!cfg_.outputs.trace.empty() && transport_->rank() == 0) write_trace_file(cfg_.outputs.trace, fragments, "--trace");
    report_.finish(hash);
  });
  if (!ok) return std::nullopt;
  return hash;
}

}  // namespace pwm::spmd
