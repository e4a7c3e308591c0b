#include "static_mpmd/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "collectives/strings.h"
#include "common/check.h"
#include "common/stats.h"
#include "dataflow/builder.h"
#include "programs/pipeline.h"
#include "programs/replicas.h"
#include "programs/trace.h"
#include "train/full_state.h"
#include "train/peak.h"

namespace pwm::static_mpmd {

using programs::State;
using programs::StepOutputs;
using programs::StepStats;
using train::Granularity;

namespace {

// Slice i's communicator's context is 1 + i * kSliceContextStride (the world's is 0; the ones
// between are its kernels' sub-groups', dataflow/kernel.h).
constexpr uint32_t kFirstSliceContext = 1;
constexpr int kChannel = collectives::kFirstFreeChannel;  // the transfers' two tag channels

// --quota: each stage's registers (activations held from its forward to its backward) must hold
// what the schedule's order keeps, or the stage could never run its next forward: refused here,
// naming the stage, its need and the quota, instead of a run that waits forever.
void validate_quota(const train::TrainConfig& cfg) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.quota < 0) PWM_THROW("--quota must be >= 0 (got {}; 0: what the schedule needs)", p.quota);
  if (p.quota == 0) return;
  if (p.stages == 1) PWM_THROW("--quota {} applies to pipelines: add --stages 2 or more, or leave it out", p.quota);
  const std::vector<int> need = programs::stage_activations(p.schedule, p.stages, cfg.workload.microbatches);
  for (int s = 0; s < p.stages; ++s)
    if (p.quota < need[static_cast<size_t>(s)])
      PWM_THROW("--quota {} is below what --schedule {} needs on stage {}: {} micro-batches' activations held from its "
                "forward to its backward (the stage's edge into its own backward); use --quota {} or more{}",
                p.quota, train::name(p.schedule), s, need[static_cast<size_t>(s)],
                *std::max_element(need.begin(), need.end()),
                p.schedule == train::Schedule::kGpipe ? ", or --schedule 1f1b (S - s on stage s)" : "");
}

// What needs a controller, or is not the static model's, refused before anything starts (one line each).
void validate(const train::TrainConfig& cfg, int world) {
  const train::MpmdConfig& p = cfg.mpmd;
  if (p.stages < 1) PWM_THROW("--stages must be at least 1 (got {})", p.stages);
  if (cfg.mesh.replicas > 1 && cfg.model.moe())
    PWM_THROW("mpmd_train runs Mixture-of-Experts models on one slice, as pathways_train: leave out --replicas "
              "(spmd_train runs MoE with --replicas)");
  if (p.stages > 1 && (cfg.mesh.fsdp || cfg.model.moe()))
    PWM_THROW("mpmd_train runs --stages without --fsdp and without MoE, as pathways_train; use spmd_train for those");
  if (p.stages > cfg.model.n_layers)
    PWM_THROW("--stages {} is more than --layers {}: each stage needs a layer", p.stages, cfg.model.n_layers);
  validate_quota(cfg);
  // (Slice i's contexts, 1 + 5 i .. 5 + 5 i, stay below the 900 left to code around it.)
  constexpr int kMaxSlices = 899 / static_cast<int>(dataflow::kSliceContextStride);
  if (cfg.mesh.replicas * p.stages > kMaxSlices)
    PWM_THROW("mpmd_train runs at most {} slices (--replicas x --stages; got {}): each takes {} of the collectives' "
              "contexts", kMaxSlices, cfg.mesh.replicas * p.stages, dataflow::kSliceContextStride);
  if (p.granularity == Granularity::kOpByOp)
    PWM_THROW("mpmd_train has no --granularity opbyop: with no controller there is no client to call node by node "
              "(use fused or chained)");
  if (p.sequential) PWM_THROW("mpmd_train has no --sequential dispatch: it has no dispatcher (leave it out)");
  if (p.spare_workers > 0) PWM_THROW("mpmd_train has no --spare-workers: with no controller nothing remaps a slice");
  if (p.expert_island) PWM_THROW("mpmd_train runs the experts on the dp slice; --expert-island runs in pathways_train");
  if (p.moe_routing == train::MoeRouting::kController)
    PWM_THROW("mpmd_train has no controller to route through: use --moe-routing worker (dropless) or static");
  if (!p.islands.empty()) PWM_THROW("mpmd_train places no islands (--islands runs in pathways_train): leave it out");
  if (p.stages == 1) return cfg.validate(world);  // replicas x dp x tp = every rank
  const int per_stage = cfg.mesh.dp * cfg.mesh.tp, need = cfg.mesh.replicas * p.stages * per_stage;
  if (world != need)
    PWM_THROW("--stages {} needs {} ranks ({}{} stages of --dp {} x --tp {}), but the job has {} (mpirun -n {})", p.stages,
              need, cfg.mesh.replicas > 1 ? fmt::format("--replicas {} x ", cfg.mesh.replicas) : "", p.stages,
              cfg.mesh.dp, cfg.mesh.tp, world, need);
  cfg.validate(cfg.mesh.replicas * per_stage);
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

std::string run_name(const train::TrainConfig& cfg) {
  if (cfg.mpmd.stages > 1) return fmt::format("static-pipeline-{}", train::name(cfg.mpmd.schedule));
  return fmt::format("static-{}", train::name(cfg.mpmd.granularity));
}

Trainer::Trainer(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport, bool resume,
                 const programs::KernelNames& names)
    : cfg_(cfg), t_(transport), world_(collectives::Communicator::world(transport)), names_(names),
      sh_(cfg, programs::PipelineShape{cfg.mpmd.stages}), devices_(cfg.mesh.dp * cfg.mesh.tp), S_(cfg.mpmd.stages),
      R_(cfg.mesh.replicas), K_(R_ * S_), pipe_(S_ > 1), exec_(transport, cfg.exec.coll_timeout, kChannel) {
  PWM_CHECK_EQ(devices_ * K_, t_->size());
  state_ = on_every_slice(names_(resume ? "load" : "init"), {cfg_.mesh.tp});
  int64_t step = 0;
  std::memcpy(&step, state_[programs::kStep]->data(), sizeof step);
  first_step_ = step;
  const double peak = cfg.exec.peak_gflops > 0 ? 0 : probe(0);
  report_ = std::make_unique<train::TrainReport>(
      cfg, run_name(cfg), devices_ * K_,
      cfg.exec.peak_gflops > 0 ? train::Peak::given(cfg.exec.peak_gflops) : train::Peak::probed(peak), t_->rank() == 0);
  step_.emplace(lower(step_program()));  // built and lowered once, on every rank alike
}

Trainer::~Trainer() = default;

std::optional<std::string> Trainer::run() { return train::run(*this, cfg_, t_->rank()); }

Prepared Trainer::lower(const dataflow::ProgramDef& def) {
  const auto lookup = [&](int slice) {
    PWM_CHECK(slice >= 0 && slice < K_, "program '{}' names slice {} of {}", def.name, slice, K_);
    std::vector<int> ranks(static_cast<size_t>(devices_));
    std::iota(ranks.begin(), ranks.end(), slice * devices_);
    return dataflow::SliceMapping{ranks, kFirstSliceContext + static_cast<uint32_t>(slice) * dataflow::kSliceContextStride, 0, 0};
  };
  dataflow::LoweredProgram lp = dataflow::lower(def, 0, lookup);
  auto it = lp.workers.find(t_->rank());
  PWM_CHECK(it != lp.workers.end(), "program '{}' has nothing for rank {}", def.name, t_->rank());
  return Prepared(std::move(it->second));
}

std::vector<State<dataflow::Value>> Trainer::state_params(dataflow::Builder& b) const {
  std::vector<State<dataflow::Value>> st;
  for (int i = 0; i < K_; ++i) {
    std::vector<dataflow::Value> v;
    for (const dataflow::ArgSpec& s : sh_.state(cfg_.mesh.tp)) v.push_back(b.param(i, devices_, s));
    st.push_back(State<dataflow::Value>::from(v));
  }
  return st;
}

dataflow::ProgramDef Trainer::step_program() const {
  const int tp = cfg_.mesh.tp;
  dataflow::Builder b(pipe_ ? "static-" + programs::pipeline_name(sh_, cfg_.mpmd.schedule) : run_name(cfg_) + "-step");
  const std::vector<State<dataflow::Value>> st = state_params(b);
  std::vector<dataflow::Value> out;
  const programs::SliceCall call = [&](int i, const std::string& k, std::vector<dataflow::Value> in,
                                       std::vector<int64_t> at) { return b.call(k, i, devices_, in, std::move(at)); };
  if (pipe_) {
    out = programs::trace_pipeline_step(sh_, names_, cfg_.mpmd.schedule, st, call);
  } else if (R_ > 1) {
    out = programs::trace_replica_step(sh_, names_, cfg_.mpmd.granularity, st, call);
  } else if (cfg_.mpmd.granularity == Granularity::kFused) {
    out = b.call(names_("fused_step"), 0, devices_, st[0].list(), {tp});
  } else {
    const programs::CallFn<dataflow::Value> call = [&](const std::string& k, std::vector<dataflow::Value> in,
                                                       std::vector<int64_t> at) {
      return b.call(k, 0, devices_, in, std::move(at));
    };
    out = programs::trace_step<dataflow::Value>(sh_, names_, tp, st[0], call);
  }
  for (const dataflow::Value& v : out) b.output(v);
  return b.build();
}

// A full-model array on replica r's first slice: a pipeline's stages merged (every stage's copy
// of the tied weights is the same; each stage's own layers), else the slice's own.
dataflow::Value Trainer::merged(dataflow::Builder& b, const std::vector<State<dataflow::Value>>& st,
                                dataflow::Value State<dataflow::Value>::*which, int r) const {
  if (!pipe_) return st[static_cast<size_t>(r)].*which;
  std::vector<dataflow::Value> in;
  for (int s = 0; s < S_; ++s) in.push_back(st[static_cast<size_t>(r * S_ + s)].*which);
  return b.call(names_("merge"), r * S_, devices_, in, {cfg_.mesh.tp})[0];
}

dataflow::ProgramDef Trainer::eval_program() const {
  const int tp = cfg_.mesh.tp;
  dataflow::Builder b("eval");
  const auto st = state_params(b);
  const int R = R_;
  if (R == 1) {
    b.output(b.call(names_("eval"), 0, devices_, {merged(b, st, &State<dataflow::Value>::params, 0)}, {tp})[0]);
    return b.build();
  }
  // Every replica evaluates its rows of its own (identical) parameters; replica 0's first slice adds.
  std::vector<dataflow::Value> sums;
  for (int r = 0; r < R; ++r)
    sums.push_back(b.call(names_("eval"), r * S_, devices_, {merged(b, st, &State<dataflow::Value>::params, r)}, {tp, r})[0]);
  b.output(b.call(names_("val_total"), 0, devices_, sums, {tp, R})[0]);
  return b.build();
}

dataflow::ProgramDef Trainer::save_program() const {
  dataflow::Builder b("save");
  const auto st = state_params(b);
  using SV = State<dataflow::Value>;
  const SV full{merged(b, st, &SV::params, 0), merged(b, st, &SV::m, 0), merged(b, st, &SV::v, 0), st[0].step};
  b.output(b.call(names_("save"), 0, devices_, full.list(), {cfg_.mesh.tp})[0]);
  return b.build();
}

dataflow::ProgramDef Trainer::hash_program(int r) const {
  dataflow::Builder b(fmt::format("hash-{}", r));
  const auto st = state_params(b);
  b.output(b.call(names_("hash"), r * S_, devices_, {merged(b, st, &State<dataflow::Value>::params, r)}, {cfg_.mesh.tp})[0]);
  return b.build();
}

const Prepared& Trainer::cached(const std::string& key, const std::function<dataflow::ProgramDef()>& build) {
  auto it = programs_.find(key);
  if (it == programs_.end()) it = programs_.emplace(key, lower(build())).first;
  return it->second;
}

std::vector<BufferPtr> Trainer::run_program(const Prepared& p, bool with_state, RunStats* stats) {
  Shards in;
  if (with_state) {
    const uint32_t first = static_cast<uint32_t>(slice_of(t_->rank()) * State<int>::kCount);
    for (size_t j = 0; j < state_.size(); ++j) in[first + static_cast<uint32_t>(j)] = state_[j];
  }
  Shards out = exec_.run(p, in, stats);
  std::vector<BufferPtr> v;
  for (auto& [i, b] : out) v.push_back(b);  // (in output order: a map)
  return v;
}

std::vector<BufferPtr> Trainer::on_every_slice(const std::string& kernel, std::vector<int64_t> attrs) {
  const Prepared& p = cached(fmt::format("{}:{}", kernel, fmt::join(attrs, ",")), [&] {
    dataflow::Builder b(kernel);
    for (int i = 0; i < K_; ++i)
      for (const dataflow::Value& v : b.call(kernel, i, devices_, {}, attrs)) b.output(v);
    return b.build();
  });
  return run_program(p, false);
}

template <typename T>
T Trainer::from_rank(const BufferPtr& b, int rank) {
  T mine{};
  if (b) std::memcpy(&mine, b->data(), sizeof mine);
  std::vector<T> v(static_cast<size_t>(t_->size()));
  world_.allgather(&mine, v.data(), 1, collectives::dtype_of<T>());
  return v.at(static_cast<size_t>(rank));
}

double Trainer::probe(double budget_s) {
  const auto out = on_every_slice(names_("gemm_probe"), {cfg_.mesh.tp, static_cast<int64_t>(budget_s * 1e6)});
  double mine = *static_cast<const double*>(out[0]->data());
  std::vector<double> all(static_cast<size_t>(t_->size()));
  world_.allgather(&mine, all.data(), 1, collectives::DataType::kFloat64);
  return std::accumulate(all.begin(), all.end(), 0.0) / static_cast<double>(all.size());
}

void Trainer::probe_peak() {
  if (report_->peak().is_given()) return;
  report_->probed(probe(train::kPeakProbeBudgetS));
}

bool Trainer::step(int64_t step) {
  RunStats rs;
  const std::vector<BufferPtr> out = run_program(*step_, true, &rs);
  PWM_CHECK_EQ(out.size(), StepOutputs<int>::kCount);
  state_.assign(out.begin(), out.begin() + State<int>::kCount);
  messages_ += rs.messages;
  recv_wait_ms_.push_back(rs.recv_wait_s * 1e3);
  peak_intermediate_ = std::max(peak_intermediate_, rs.peak_intermediate_bytes);
  // Every device's statistics on every rank (the same report everywhere, as spmd_train's).
  const size_t words = static_cast<size_t>(sh_.stats_words());
  std::vector<double> all(words * static_cast<size_t>(t_->size()));
  world_.allgather(out[StepOutputs<int>::kStats]->data(), all.data(), words, collectives::DataType::kFloat64);
  const std::vector<StepStats> devices = StepStats::read_all(all, static_cast<int64_t>(words));
  const StepStats& last = devices[static_cast<size_t>((K_ - 1) * devices_)];  // the loss is on the last slice
  programs::StepTiming timing = programs::step_timing(step, devices, last, &last_end_us_);
  train::StepRecord& r = timing.record;
  if (pipe_) bubbles_.push_back(timing.bubble);
  if (R_ > 1 && !pipe_) {  // (the pipeline's update does not time the exchange)
    const programs::ExchangeTimes x = programs::exchange_times(devices);
    exposed_.push_back(x.exposed_ms);
    tails_.push_back(x.tail_ms);
  }
  if (cfg_.model.moe()) r.moe = programs::moe_record(devices, cfg_, 0);  // (no controller: no round trip)
  report_->step(r);
  // A failed metrics write (rank 0's) ends the job now with its one line (run_mpi_main).
  if (report_->failed()) throw Error(report_->error());
  return !report_->stopped();
}

double Trainer::evaluate() {
  const auto out = run_program(cached("eval", [this] { return eval_program(); }), true);
  return from_rank<double>(out.empty() ? nullptr : out[0], 0);
}

bool Trainer::save(int64_t) {
  run_program(cached("save", [this] { return save_program(); }), true);  // (a failed write throws there: the job ends)
  return true;
}

void Trainer::before_final() {
  // Memory, before the final evaluation and checkpoint, as the other trainers measure it.
  const auto m = on_every_slice(names_("memory"), {cfg_.mesh.tp});
  int64_t mine[2];
  std::memcpy(mine, m[0]->data(), sizeof mine);
  std::vector<int64_t> all(2 * static_cast<size_t>(t_->size()));
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
  double mine_w[3] = {static_cast<double>(messages_) / static_cast<double>(steps),
                      recv_wait_ms_.empty() ? 0.0 : median(recv_wait_ms_), static_cast<double>(peak_intermediate_)};
  std::vector<double> w(3 * static_cast<size_t>(t_->size()));
  world_.allgather(mine_w, w.data(), 3, collectives::DataType::kFloat64);
  double msgs = 0, wait = 0;
  std::vector<double> inter(static_cast<size_t>(K_), 0.0);  // per slice (a pipeline: per stage), its largest
  for (int r = 0; r < t_->size(); ++r) {
    const double* x = &w[3 * static_cast<size_t>(r)];
    msgs = std::max(msgs, x[0]);
    wait = std::max(wait, x[1]);
    inter[static_cast<size_t>(slice_of(r))] = std::max(inter[static_cast<size_t>(slice_of(r))], x[2]);
  }
  report_->set_extra("messages_per_step", msgs);
  report_->set_extra("recv_wait_ms", wait);
  report_->set_extra_list("peak_intermediate_bytes", inter);
  if (R_ > 1) report_->set_extra("dcn_bytes_per_step", programs::replica_bytes_per_step(sh_, devices_));
  if (!exposed_.empty()) report_->set_extra("xchg_exposed_ms", median(exposed_));
  if (!tails_.empty()) report_->set_extra("xchg_tail_ms", median(tails_));
  if (pipe_ && !bubbles_.empty()) {
    report_->set_extra("bubble", median(bubbles_));
    report_->set_extra("bubble_bound", static_cast<double>(S_ - 1) / static_cast<double>(cfg_.workload.microbatches + S_ - 1));
    report_->set_extra("stages", S_);
    std::vector<double> regs;  // each stage's activations held at once by the schedule's order (--quota's need)
    for (int n : programs::stage_activations(cfg_.mpmd.schedule, S_, cfg_.workload.microbatches)) regs.push_back(n);
    report_->set_extra_list("stage_activations", regs);
    report_->set_extra("stage_dp", cfg_.mesh.dp);
    report_->set_extra("stage_tp", cfg_.mesh.tp);
  }
}

std::optional<std::string> Trainer::finish() {
  std::string h;
  for (int r = 0; r < R_; ++r) {
    const auto out = run_program(cached(fmt::format("hash-{}", r), [this, r] { return hash_program(r); }), true);
    // (replica r's hash is on its first slice's first rank)
    const int64_t hv = from_rank<int64_t>(out.empty() ? nullptr : out[0], r * S_ * devices_);
    uint64_t hash;
    std::memcpy(&hash, &hv, sizeof hash);
    const std::string hr = train::hash_hex(hash);
    if (r == 0) h = hr;
    // Replicas: no parameter was ever sent between them; every replica must still hold the same bits.
    if (hr != h)
      throw Error(fmt::format("replica {}'s parameters differ from replica 0's after {} steps (the replicas' updates "
                              "diverged): a bug in the exchange", r, cfg_.workload.steps));
  }
  if (!cfg_.outputs.trace.empty()) {
    const int64_t words = 1 << 20;  // 8 MiB of trace per device at most
    const auto tr = on_every_slice(names_("trace"), {cfg_.mesh.tp, words});
    const auto* w = static_cast<const int64_t*>(tr[0]->data());
    const std::string mine(reinterpret_cast<const char*>(w + 1), static_cast<size_t>(w[0]));
    const std::vector<std::string> fragments = collectives::allgather_strings(world_, mine);
    if (t_->rank() == 0) write_trace_file(cfg_.outputs.trace, fragments, "--trace");
  }
  report_->finish(h);  // (rank 0 writes; a failed write throws there and ends the job)
  return h;
}

}  // namespace pwm::static_mpmd
