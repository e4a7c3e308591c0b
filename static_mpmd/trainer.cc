#include "static_mpmd/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/strings.h"
#include "common/check.h"
#include "common/stats.h"
#include "common/time.h"
#include "dataflow/builder.h"
#include "programs/trace.h"
#include "train/checks.h"
#include "train/full_state.h"
#include "train/peak.h"

namespace pwm::static_mpmd {

using programs::State;
using programs::StepOutputs;
using programs::StepStats;
using train::Granularity;

namespace {

constexpr int kSlice = 0;                    // the one slice: every world rank, in rank order
constexpr uint32_t kSliceContext = 1;        // its communicator's context (the world's is 0)
constexpr int kChannel = collectives::kFirstFreeChannel;  // the transfers' two tag channels

// What the static model does not run yet, refused before anything starts (one line each).
void validate(const train::TrainConfig& cfg, int world) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.stages > 1)
    PWM_THROW("mpmd_train runs one dp x tp slice for now; pipelines (--stages {}) run in pathways_train", p.stages);
  if (cfg.mesh.replicas > 1)
    PWM_THROW("mpmd_train runs one dp x tp slice for now; --replicas {} runs in pathways_train or spmd_train",
              cfg.mesh.replicas);
  if (p.granularity == Granularity::kOpByOp)
    PWM_THROW("mpmd_train has no --granularity opbyop: with no controller there is no client to call node by node "
              "(use fused or chained)");
  if (p.sequential) PWM_THROW("mpmd_train has no --sequential dispatch: it has no dispatcher (leave it out)");
  if (p.spare_workers > 0) PWM_THROW("mpmd_train has no --spare-workers: with no controller nothing remaps a slice");
  if (p.expert_island) PWM_THROW("mpmd_train runs the experts on the dp slice; --expert-island runs in pathways_train");
  if (p.moe_routing == train::MoeRouting::kController)
    PWM_THROW("mpmd_train has no controller to route through: use --moe-routing worker (dropless) or static");
  if (!p.islands.empty()) PWM_THROW("mpmd_train places no islands (--islands runs in pathways_train): leave it out");
  cfg.validate(world);  // dp x tp = every rank
}

}  // namespace

train::TrainerSpec trainer_spec() {
  train::TrainerSpec s;
  s.program = "mpmd_train";
  s.description =
      "Static MPMD trainer: every rank runs its own part of the training step's program in a fixed order, with no "
      "controller.";
  s.flags = train::FlagSet::kMpmd;
  s.validate = validate;
  return s;
}

std::string run_name(const train::TrainConfig& cfg) { return fmt::format("static-{}", train::name(cfg.mpmd.granularity)); }

Trainer::Trainer(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport, bool resume,
                 const programs::KernelNames& names)
    : cfg_(cfg), t_(transport), world_(collectives::Communicator::world(transport)), names_(names),
      sh_(cfg, programs::PipelineShape{}), devices_(cfg.mesh.dp * cfg.mesh.tp),
      exec_(transport, cfg.exec.coll_timeout, kChannel) {
  PWM_CHECK_EQ(devices_, t_->size());
  state_ = single(names_(resume ? "load" : "init"), {}, {cfg_.mesh.tp});
  int64_t step = 0;
  std::memcpy(&step, state_[programs::kStep]->data(), sizeof step);
  first_step_ = step;
  const double peak = cfg.exec.peak_gflops > 0 ? 0 : probe(0);
  report_ = std::make_unique<train::TrainReport>(
      cfg, run_name(cfg), devices_, cfg.exec.peak_gflops > 0 ? train::Peak::given(cfg.exec.peak_gflops) : train::Peak::probed(peak),
      t_->rank() == 0);
  step_ = lower(step_program());  // built and lowered once, on every rank alike
}

Trainer::~Trainer() = default;

std::optional<std::string> Trainer::run() { return train::run(*this, cfg_, t_->rank()); }

dataflow::WorkerProgram Trainer::lower(const dataflow::ProgramDef& def) {
  std::vector<int> ranks(static_cast<size_t>(devices_));
  std::iota(ranks.begin(), ranks.end(), 0);
  const auto lookup = [&](int slice) {
    PWM_CHECK_EQ(slice, kSlice);
    return dataflow::SliceMapping{ranks, kSliceContext, 0, 0};
  };
  dataflow::LoweredProgram lp = dataflow::lower(def, 0, lookup);
  auto it = lp.workers.find(t_->rank());
  PWM_CHECK(it != lp.workers.end(), "program '{}' has nothing for rank {}", def.name, t_->rank());
  return std::move(it->second);
}

dataflow::ProgramDef Trainer::step_program() const {
  const int tp = cfg_.mesh.tp;
  dataflow::Builder b(run_name(cfg_) + "-step");
  std::vector<dataflow::Value> st;
  for (const dataflow::ArgSpec& s : sh_.state(tp)) st.push_back(b.param(kSlice, devices_, s));
  std::vector<dataflow::Value> out;
  if (cfg_.mpmd.granularity == Granularity::kFused) {
    out = b.call(names_("fused_step"), kSlice, devices_, st, {tp});
  } else {
    const programs::CallFn<dataflow::Value> call = [&](const std::string& k, std::vector<dataflow::Value> in,
                                                       std::vector<int64_t> at) {
      return b.call(k, kSlice, devices_, in, std::move(at));
    };
    out = programs::trace_step<dataflow::Value>(sh_, names_, tp, State<dataflow::Value>::from(st), call);
  }
  for (const dataflow::Value& v : out) b.output(v);
  return b.build();
}

std::vector<BufferPtr> Trainer::run_program(const dataflow::WorkerProgram& p, const std::vector<BufferPtr>& inputs,
                                            RunStats* stats) {
  Shards in;
  for (size_t i = 0; i < inputs.size(); ++i) in[static_cast<uint32_t>(i)] = inputs[i];
  Shards out = exec_.run(p, in, stats);
  std::vector<BufferPtr> v;
  for (auto& [i, b] : out) {
    PWM_CHECK_EQ(static_cast<size_t>(i), v.size());  // every output has a shard on every rank of the slice
    v.push_back(b);
  }
  return v;
}

std::vector<BufferPtr> Trainer::single(const std::string& kernel, const std::vector<BufferPtr>& inputs,
                                       std::vector<int64_t> attrs) {
  const std::string key = fmt::format("{}{}", kernel, fmt::join(attrs, ","));
  auto it = singles_.find(key);
  if (it == singles_.end()) {
    const dataflow::KernelDef* def = dataflow::KernelRegistry::global().find(kernel);
    PWM_CHECK(def, "kernel '{}' is not registered", kernel);
    dataflow::Builder b(kernel);
    std::vector<dataflow::Value> in;
    for (const dataflow::ArgSpec& s : def->signature(attrs, devices_).inputs) in.push_back(b.param(kSlice, devices_, s));
    for (const dataflow::Value& v : b.call(kernel, kSlice, devices_, in, attrs)) b.output(v);
    it = singles_.emplace(key, lower(b.build())).first;
  }
  return run_program(it->second, inputs);
}

template <typename T>
T Trainer::from_rank0(const BufferPtr& b) {
  T mine{};
  std::memcpy(&mine, b->data(), sizeof mine);
  std::vector<T> v(static_cast<size_t>(devices_));
  world_.allgather(&mine, v.data(), 1, collectives::dtype_of<T>());
  return v[0];
}

double Trainer::probe(double budget_s) {
  const auto out = single(names_("gemm_probe"), {}, {cfg_.mesh.tp, static_cast<int64_t>(budget_s * 1e6)});
  double mine = *static_cast<const double*>(out[0]->data());
  std::vector<double> all(static_cast<size_t>(devices_));
  world_.allgather(&mine, all.data(), 1, collectives::DataType::kFloat64);
  return std::accumulate(all.begin(), all.end(), 0.0) / static_cast<double>(all.size());
}

void Trainer::probe_peak() {
  if (report_->peak().is_given()) return;
  report_->probed(probe(train::kPeakProbeBudgetS));
}

bool Trainer::step(int64_t step) {
  RunStats rs;
  const std::vector<BufferPtr> out = run_program(step_, state_, &rs);
  PWM_CHECK_EQ(out.size(), StepOutputs<int>::kCount);
  state_.assign(out.begin(), out.begin() + State<int>::kCount);
  messages_ += rs.messages;
  recv_wait_ms_.push_back(rs.recv_wait_s * 1e3);
  // Every device's statistics on every rank (the same report everywhere, as spmd_train's).
  const size_t words = static_cast<size_t>(sh_.stats_words());
  std::vector<double> all(words * static_cast<size_t>(devices_));
  world_.allgather(out[StepOutputs<int>::kStats]->data(), all.data(), words, collectives::DataType::kFloat64);
  const std::vector<StepStats> devices = StepStats::read_all(all, static_cast<int64_t>(words));
  double end_us = 0, first_busy = 0;
  for (const StepStats& d : devices) {
    end_us = std::max(end_us, d.end_us);
    first_busy = std::max(first_busy, d.busy_ms);
  }
  train::StepRecord r;
  r.step = step;
  r.step_ms = last_end_us_ < 0 ? first_busy : (end_us - last_end_us_) * 1e-3;
  last_end_us_ = end_us;
  r.loss = devices[0].loss;
  r.grad_norm = devices[0].grad_norm;
  r.lr = devices[0].lr;
  for (const StepStats& d : devices) {
    const double busy = std::min(d.busy_ms, r.step_ms);
    r.compute_ms.push_back(busy - d.comm_ms);
    r.comm_ms.push_back(d.comm_ms + (r.step_ms - busy));  // communication or waiting for a peer
    r.wait_ms.push_back(r.step_ms - busy);
  }
  if (cfg_.model.moe()) {
    std::vector<double> sum;
    for (const StepStats& d : devices) {
      sum.resize(d.moe.size() - 2, 0.0);
      for (size_t i = 0; i + 2 < d.moe.size(); ++i) sum[i] += d.moe[i];
    }
    r.moe = train::moe_record(sum, cfg_);
  }
  report_->step(r);
  // A failed metrics write (rank 0's) ends the job now with its one line (run_mpi_main).
  if (report_->failed()) throw Error(report_->error());
  return !report_->stopped();
}

double Trainer::evaluate() {
  return from_rank0<double>(single(names_("eval"), {state_[programs::kParams]}, {cfg_.mesh.tp})[0]);
}

bool Trainer::save(int64_t) {
  single(names_("save"), state_, {cfg_.mesh.tp});  // (a failed write throws on the writing rank: the job ends)
  return true;
}

void Trainer::before_final() {
  // Memory, before the final evaluation and checkpoint, as the other trainers measure it.
  const auto m = single(names_("memory"), {}, {cfg_.mesh.tp});
  int64_t mine[2];
  std::memcpy(mine, m[0]->data(), sizeof mine);
  std::vector<int64_t> all(2 * static_cast<size_t>(devices_));
  world_.allgather(mine, all.data(), 2, collectives::DataType::kInt64);
  int64_t peak_rss = 0, held = 0;
  for (size_t i = 0; i + 1 < all.size(); i += 2) {
    peak_rss = std::max(peak_rss, all[i]);
    held = std::max(held, all[i + 1]);
  }
  report_->set_extra("peak_rss_bytes", static_cast<double>(peak_rss));
  report_->set_extra("state_bytes", 4.0 * static_cast<double>(sh_.state_floats(cfg_.mesh.tp)) * sizeof(float) +
                                        static_cast<double>(held));
  // The static order's cost: point-to-point messages a rank sends per step, and the time it
  // waited for its receives before its kernels (median step, the slowest rank).
  const int64_t steps = std::max<int64_t>(1, static_cast<int64_t>(recv_wait_ms_.size()));
  double mine_w[2] = {static_cast<double>(messages_) / static_cast<double>(steps),
                      recv_wait_ms_.empty() ? 0.0 : median(recv_wait_ms_)};
  std::vector<double> w(2 * static_cast<size_t>(devices_));
  world_.allgather(mine_w, w.data(), 2, collectives::DataType::kFloat64);
  double msgs = 0, wait = 0;
  for (size_t i = 0; i + 1 < w.size(); i += 2) {
    msgs = std::max(msgs, w[i]);
    wait = std::max(wait, w[i + 1]);
  }
  report_->set_extra("messages_per_step", msgs);
  report_->set_extra("recv_wait_ms", wait);
}

std::optional<std::string> Trainer::finish() {
  const int64_t hv = from_rank0<int64_t>(single(names_("hash"), {state_[programs::kParams]}, {cfg_.mesh.tp})[0]);
  uint64_t hash;
  std::memcpy(&hash, &hv, sizeof hash);
  const std::string h = train::hash_hex(hash);
  if (!cfg_.outputs.trace.empty()) {
    const int64_t words = 1 << 20;  // 8 MiB of trace per device at most
    const auto tr = single(names_("trace"), {}, {cfg_.mesh.tp, words});
    const auto* w = static_cast<const int64_t*>(tr[0]->data());
    const std::string mine(reinterpret_cast<const char*>(w + 1), static_cast<size_t>(w[0]));
    const std::vector<std::string> fragments = collectives::allgather_strings(world_, mine);
    if (t_->rank() == 0) write_trace_file(cfg_.outputs.trace, fragments, "--trace");
  }
  report_->finish(h);  // (rank 0 writes; a failed write throws there and ends the job)
  return h;
}

}  // namespace pwm::static_mpmd
