#include "pathways/train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "common/check.h"
#include "common/stats.h"
#include "common/time.h"
#include "pathways/resource_manager.h"
#include "pathways/runtime.h"
#include "pathways/train/step_program.h"
#include "train/full_state.h"

namespace pwm::pathways::train {

using pwm::train::Granularity;

std::string run_name(const pwm::train::TrainConfig& cfg) {
  if (cfg.mpmd.stages > 1) return fmt::format("pathways-pipeline-{}", pwm::train::name(cfg.mpmd.schedule));
  return fmt::format("pathways-{}", pwm::train::name(cfg.mpmd.granularity));
}

namespace {

// A Mixture-of-Experts model: one slice (no pipeline, no replicas yet), and a routing that fits
// the capacity and the granularity.
void validate_moe(const pwm::train::TrainConfig& cfg) {
  using pwm::train::MoeRouting;
  const MoeRouting r = cfg.mpmd.moe_routing;
  if (!cfg.model.moe()) {
    if (r != MoeRouting::kAuto)
      PWM_THROW("--moe-routing {} applies to Mixture-of-Experts models: add --experts E or leave it out", name(r));
    return;
  }
  if (cfg.mpmd.stages > 1 || cfg.mesh.replicas > 1)
    PWM_THROW("pathways_train runs Mixture-of-Experts models on one slice: leave out --stages and --replicas "
              "(spmd_train runs MoE with --replicas)");
  const bool dropless = cfg.model.capacity_factor == 0.0;
  if (r == MoeRouting::kStatic && dropless)
    PWM_THROW("--moe-routing static needs a capacity (--capacity-factor > 0): dropless counts are known only at run "
              "time (use --moe-routing controller or worker)");
  if ((r == MoeRouting::kController || r == MoeRouting::kWorker) && !dropless)
    PWM_THROW("--moe-routing {} routes dropless layers: set --capacity-factor 0 (or use --moe-routing static)", name(r));
  if (r == MoeRouting::kController && cfg.mpmd.granularity == Granularity::kFused)
    PWM_THROW("--moe-routing controller needs --granularity chained or opbyop: a fused step is one kernel, the "
              "controller cannot read the counts inside it");
}

// --expert-island: an MoE model at chained or opbyop (any routing), one experts' device per dense device (the expert-parallel group is the dp slice: spmd_train's
// --dp D --expert-parallel D), on one slice (no pipeline, replicas or --fsdp: validate_moe).
void validate_island(const pwm::train::TrainConfig& cfg, int workers) {
  if (!cfg.mpmd.expert_island) return;
  if (!cfg.model.moe()) PWM_THROW("--expert-island places the experts of a Mixture-of-Experts model: add --experts E");
  if (cfg.mpmd.granularity == Granularity::kFused)
    PWM_THROW("--expert-island needs --granularity chained or opbyop: the experts' calls are nodes of their own, which a "
              "fused step (one kernel) cannot send to another island");
  if (cfg.mesh.ep != cfg.mesh.dp)
    PWM_THROW("--expert-island needs --expert-parallel equal to --dp (got {} and {}): one experts' device per dense device",
              cfg.mesh.ep, cfg.mesh.dp);
  if (workers != 2 * cfg.mesh.dp)
    PWM_THROW("--expert-island needs {} workers (--dp {} dense devices and {} experts' devices), but the job has {} "
              "(mpirun -n {})",
              2 * cfg.mesh.dp, cfg.mesh.dp, cfg.mesh.dp, workers, 2 * cfg.mesh.dp + 1);
}

// --spare-workers: what in-job recovery supports (docs/failures.md, "Recovery in the job").
void validate_spares(const pwm::train::TrainConfig& cfg, int workers) {
  const pwm::train::MpmdConfig& p = cfg.mpmd;
  if (p.spare_workers < 0) PWM_THROW("--spare-workers must be 0 or more (got {})", p.spare_workers);
  if (p.spare_workers == 0) return;
  if (cfg.model.moe() || p.expert_island || cfg.mesh.fsdp)
    PWM_THROW("--spare-workers runs dense models without --fsdp");
  if (p.spare_workers >= workers)
    PWM_THROW("--spare-workers {} leaves no worker for the slices: the job has {} workers (mpirun -n {})", p.spare_workers,
              workers, workers + 1);
}

// The checks pathways_train adds to TrainConfig::validate: a controller and enough workers, a
// pipeline's layers and devices, what the runtime does not run.
void validate(const pwm::train::TrainConfig& cfg, int world) {
  const pwm::train::MpmdConfig& p = cfg.mpmd;
  if (world - 1 < 1) PWM_THROW("pathways_train needs a controller and at least one worker: mpirun -n 2 or more");
  validate_spares(cfg, world - 1);
  const int workers = world - 1 - p.spare_workers;  // (the spares hold no slice until one is lost)
  if (p.stages < 1) PWM_THROW("--stages must be at least 1 (got {})", p.stages);
  if (p.quota != 0)
    PWM_THROW("--quota is mpmd_train's (the static model's registers); pathways_train's workers hold what the "
              "schedule's order keeps: leave it out");
  if (cfg.mesh.fsdp && (p.stages > 1 || cfg.model.moe()))
    PWM_THROW("pathways_train runs --fsdp without --stages and without MoE; use spmd_train for those");
  validate_moe(cfg);
  validate_island(cfg, workers);
  if (!p.islands.empty()) pathways::ResourceManager::parse_islands(p.islands);  // its fit: the resource manager's
  if (p.expert_island) return cfg.validate(workers / 2);
  if (cfg.mesh.replicas > 1 && p.granularity == Granularity::kOpByOp)
    PWM_THROW("--replicas {} runs --granularity fused or chained, not opbyop", cfg.mesh.replicas);
  if (p.stages == 1) return cfg.validate(workers);  // dp x tp = the workers (world rank 0 is the controller)
  if (p.stages > cfg.model.n_layers)
    PWM_THROW("--stages {} is more than --layers {}: each stage needs a layer", p.stages, cfg.model.n_layers);
  // Every replica is a pipeline of S stages, each a --dp x --tp slice.
  const int per_stage = cfg.mesh.dp * cfg.mesh.tp, need = cfg.mesh.replicas * p.stages * per_stage;
  if (workers != need)
    PWM_THROW("--stages {} needs {} workers ({}{} stages of --dp {} x --tp {} devices), but the job has {} (mpirun -n {})",
              p.stages, need, cfg.mesh.replicas > 1 ? fmt::format("--replicas {} x ", cfg.mesh.replicas) : "", p.stages,
              cfg.mesh.dp, cfg.mesh.tp, workers, need + 1);
  cfg.validate(cfg.mesh.replicas * per_stage);
}

}  // namespace

pwm::train::TrainerSpec trainer_spec() {
  pwm::train::TrainerSpec s;
  s.program = "pathways_train";
  s.description =
      "Pathways trainer: a single controller (rank 0) dispatches the training step as programs to the worker ranks.";
  s.flags = pwm::train::FlagSet::kMpmd;
  s.controller = true;
  s.validate = validate;
  // The runtime's own trace (PWM_PW_TRACE) is written at shutdown, after the training: check its
  // path now, read where the runtime reads it.
  s.more_outputs = [] {
    return std::vector<pwm::train::NamedPath>{{"PWM_PW_TRACE", RuntimeOptions::from_env().trace_path}};
  };
  return s;
}

Trainer::Trainer(const pwm::train::TrainConfig& cfg, Client& client, int num_islands, bool resume,
                 const KernelNames& names)
    : cfg_(cfg), client_(client), names_(names), pipe_(cfg.mpmd.stages > 1), R_(cfg.mesh.replicas),
      S_(cfg.mpmd.stages), devices_(cfg.mesh.dp * cfg.mesh.tp), sh_(cfg, PipelineShape{cfg.mpmd.stages}),
      trace_(!cfg.outputs.trace.empty(), 0, 0) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);  // the workers' rows name their hosts too (programs/device.cc)
  trace_.process_name(fmt::format("controller (rank 0) on {}", host));
  ro_.sequential = cfg.mpmd.sequential;
  // The pipeline's schedule is the order of each stage's nodes: run in that order, a stage holds
  // the activations its schedule keeps (1F1B: at most S - s micro-batches), not all M.
  ro_.in_order = pipe_;
  place_slices(num_islands);
  const int tp = cfg.mesh.tp;
  for (auto& sl : slices_)
    states_.push_back(ArrayState::from(dispatch(single(names_(resume ? "load" : "init"), sl, {}, {tp}), {}, "init")));
  for (size_t j = 0; j < expert_slices_.size(); ++j)  // (expert-parallel rank j's state: attrs[1])
    expert_states_.push_back(ArrayState::from(dispatch(
        single(names_(resume ? "load" : "init"), expert_slices_[j], {}, {tp, static_cast<int64_t>(j)}), {}, "init")));
  first_step_ = static_cast<int64_t>(states_[0].step.get<int64_t>()[0]);
  if (resume) saved_step_ = first_step_;
  for (auto& sl : slices_) slice_devices_.push_back(sl.devices());
  report_ = std::make_unique<pwm::train::TrainReport>(
      cfg, run_name(cfg), devices_ * R_ * S_,
      cfg.exec.peak_gflops > 0 ? pwm::train::Peak::given(cfg.exec.peak_gflops) : pwm::train::Peak::probed(probe_workers(0)),
      true);
  step_prog_ = build_step_program();  // built once; lowered once; each run sends only ids and handles
}

Trainer::~Trainer() = default;

std::optional<std::string> Trainer::run() {
  // The loop's kill hook for world rank 0 is the controller's (a worker kills itself inside its
  // step kernel: programs/step_kernels.cc).
  return pwm::train::run(*this, cfg_, 0);
}

void Trainer::place_slices(int num_islands) {
  const std::vector<int> mesh{cfg_.mesh.dp, cfg_.mesh.tp};
  if (pipe_) {
    // One island per stage (of every replica) when there are islands enough; else, with
    // replicas, replica r's stages on island r (mod the islands, as the replicas' slices below);
    // else stage s on island s while there are islands, the stages beyond on the least loaded
    // devices of any island (island s mod K could be a one-device island already holding a
    // stage while another island's devices idle).
    for (int r = 0; r < R_; ++r)
      for (int s = 0; s < S_; ++s) {
        const int i = r * S_ + s;
        const int island = R_ * S_ <= num_islands ? i : R_ > 1 ? r % num_islands : (s < num_islands ? s : -1);
        slices_.push_back(client_.allocate(devices_, mesh, island));
      }
  } else if (R_ > 1) {  // replica r on island r (mod the islands: one island holds several in tests)
    for (int r = 0; r < R_; ++r) slices_.push_back(client_.allocate(devices_, mesh, r % num_islands));
  } else if (sh_.expert_island()) {
    // The dense slice on island 0, the experts' devices on the next island (or beside it when
    // there is one island), each a slice of its own: device j's node takes every dense device's
    // block for it whole.
    slices_.push_back(client_.allocate(devices_, mesh, 0));
    for (int j = 0; j < cfg_.mesh.ep; ++j) expert_slices_.push_back(client_.allocate(1, {1, 1}, num_islands > 1 ? 1 : 0));
  } else {
    slices_.push_back(client_.allocate(devices_, mesh));
  }
}

std::vector<Slice> Trainer::all_slices() const {
  std::vector<Slice> all = slices_;
  all.insert(all.end(), expert_slices_.begin(), expert_slices_.end());
  return all;
}

template <typename V>
ExpertIsland<V> Trainer::island(const std::vector<State<V>>& states,
                                std::function<std::vector<V>(const std::string&, const Slice&, std::vector<V>,
                                                             std::vector<int64_t>)>
                                    call) const {
  if (expert_slices_.empty()) return {};
  ExpertIsland<V> isl;
  isl.states = states;
  isl.call = [this, call](int j, const std::string& k, std::vector<V> in, std::vector<int64_t> at) {
    return call(k, expert_slices_[static_cast<size_t>(j)], std::move(in), std::move(at));
  };
  return isl;
}

Program Trainer::single(const std::string& kernel, const Slice& s, const std::vector<Array>& in,
                        std::vector<int64_t> attrs) const {
  ProgramBuilder b(kernel);
  std::vector<Value> vals;
  for (auto& a : in) vals.push_back(b.param_like(a));
  for (auto& v : b.call(kernel, s, vals, std::move(attrs))) b.output(v);
  return b.build();
}

Program Trainer::build_step_program() const {
  if (pipe_) return pipeline_program(sh_, names_, cfg_.mpmd.schedule, slices_, states_);
  if (R_ > 1) return replica_program(sh_, names_, cfg_.mpmd.granularity, slices_, states_, &fsdp_program_held_);
  switch (cfg_.mpmd.granularity) {
    case Granularity::kFused: return single(names_("fused_step"), slices_[0], states_[0].list(), {cfg_.mesh.tp});
    case Granularity::kChained: return controller_routing() ? Program{} : chained_program();  // (segmented_step)
    case Granularity::kOpByOp: return {};  // no program: run_step calls node by node
  }
  PWM_THROW("unknown granularity");
}

bool Trainer::controller_routing() const {
  return cfg_.model.moe() && cfg_.mpmd.routing(cfg_.model) == pwm::train::MoeRouting::kController;
}

// --moe-routing controller: the controller reads an MoE layer's counts (a round trip to the
// workers: every device's rows per expert, [dp, E]) and puts on each device what its block_fwd
// needs (Shapes::route_counts: the rows it will receive, then its own), 2E words a device.
Array Trainer::route(const Array& counts) {
  const int64_t t0 = now_us();
  const std::vector<int64_t> rows = counts.get<int64_t>();
  trace_.span("wait moe counts", "wait", t0, now_us());
  const int64_t E = cfg_.model.experts, dp = cfg_.mesh.dp, P = cfg_.mesh.ep, per = E / P;
  std::vector<int64_t> put;
  put.reserve(static_cast<size_t>(dp * 2 * E));
  for (int64_t d = 0; d < dp; ++d) {
    const int64_t me = d % P, g0 = d - me;  // as TrainingDevice::ep_rank and ep_comm
    for (int64_t q = 0; q < P; ++q)
      for (int64_t j = 0; j < per; ++j) put.push_back(rows[static_cast<size_t>((g0 + q) * E + me * per + j)]);
    put.insert(put.end(), rows.begin() + d * E, rows.begin() + (d + 1) * E);
  }
  return client_.put<int64_t>(slices_[0], Sharding::kSplit, {dp * 2 * E}, put);
}

// --expert-island with --moe-routing controller: the controller reads the dense devices' counts
// for experts' device j (a round trip: [dp, El], each device's rows per expert of j) and puts
// them on that device, where expert_fwd reads them.
Array Trainer::island_route(const Array& counts, int j) {
  const int64_t t0 = now_us();
  const std::vector<int64_t> rows = counts.get<int64_t>();
  trace_.span("wait moe counts", "wait", t0, now_us());
  return client_.put<int64_t>(expert_slices_[static_cast<size_t>(j)], Sharding::kReplicated,
                              {static_cast<int64_t>(rows.size())}, rows);
}

Program Trainer::chained_program() const {
  ProgramBuilder b("chained-step");
  const auto params = [&b](const ArrayState& s) {
    std::vector<Value> v;
    for (auto& a : s.list()) v.push_back(b.param_like(a));
    return State<Value>::from(v);
  };
  const State<Value> st = params(states_[0]);
  std::vector<State<Value>> experts;
  for (const ArrayState& s : expert_states_) experts.push_back(params(s));
  const CallFn<Value> call = [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
    return b.call(k, slices_[0], in, std::move(at));
  };
  const ExpertIsland<Value> isl =
      island<Value>(experts, [&b](const std::string& k, const Slice& sl, std::vector<Value> in, std::vector<int64_t> at) {
        return b.call(k, sl, in, std::move(at));
      });
  for (auto& v : trace_step<Value>(sh_, names_, cfg_.mesh.tp, st, call, {}, &fsdp_program_held_,
                                   expert_slices_.empty() ? nullptr : &isl))
    b.output(v);
  return b.build();
}

std::vector<Array> Trainer::run_step() {
  RouteFn<Array> route;
  if (controller_routing()) route = [this](const Array& counts) { return this->route(counts); };
  if (!pipe_ && cfg_.mpmd.granularity == Granularity::kOpByOp) {
    const CallFn<Array> call = [&](const std::string& k, std::vector<Array> in, std::vector<int64_t> at) {
      return client_.call(k, slices_[0], in, std::move(at), ro_);
    };
    ExpertIsland<Array> isl = island<Array>(
        expert_states_, [this](const std::string& k, const Slice& sl, std::vector<Array> in, std::vector<int64_t> at) {
          return client_.call(k, sl, in, std::move(at), ro_);
        });
    if (route && !expert_slices_.empty()) {  // (the island's round trips: island_route)
      isl.route = [this](const Array& counts, int j) { return island_route(counts, j); };
      route = {};
    }
    return trace_step<Array>(sh_, names_, cfg_.mesh.tp, states_[0], call, route, &fsdp_program_held_,
                             expert_slices_.empty() ? nullptr : &isl);
  }
  if (route) {  // chained, cut at the routing (segmented_step): built on the first step
    if (!segmented_)
      segmented_ = std::make_unique<SegmentedStep>(
          segmented_step(sh_, names_, slices_[0], states_[0], expert_slices_, expert_states_));
    std::vector<Array> in = states_[0].list();
    for (auto& s : expert_states_)
      for (auto& a : s.list()) in.push_back(a);
    const int64_t t0 = now_us();
    auto out = segmented_->run(client_, in, ro_, [&](const Array& counts, size_t i) {
      return expert_slices_.empty() ? this->route(counts) : island_route(counts, static_cast<int>(i));
    });
    trace_.span("dispatch step", "dispatch", t0, now_us());
    return out;
  }
  std::vector<Array> in;
  for (auto& s : states_)
    for (auto& a : s.list()) in.push_back(a);
  for (auto& s : expert_states_)
    for (auto& a : s.list()) in.push_back(a);
  return dispatch(step_prog_, in, "step");
}

std::vector<Array> Trainer::dispatch(const Program& p, const std::vector<Array>& in, const std::string& what) {
  const int64_t t0 = now_us();
  auto out = client_.run(p, in, ro_);
  trace_.span("dispatch " + what, "dispatch", t0, now_us());
  return out;
}

std::vector<double> Trainer::fetch(const Array& a, const std::string& what) {
  const int64_t t0 = now_us();
  auto v = a.get<double>();
  trace_.span("wait " + what, "wait", t0, now_us());
  return v;
}

bool Trainer::step(int64_t step) {
  launch(step);
  // Two steps stay in flight while the controller reads the statistics of the one before. A
  // worker answers a fetch only between kernels, so with one in flight a fused step (one kernel)
  // would have its predecessor's statistics fetched only when it ends, and the next step
  // dispatched only after that round trip: the devices would idle for it every step.
  constexpr size_t kInFlight = 2;
  // A failed metrics write throws from drain_one (the controller's error ends the job); a
  // non-finite step beyond --skip-nonfinite returns false (the steps after it, in flight, are
  // never reported: the run ends before anything else).
  return pending_.size() <= kInFlight || drain_one();
}

void Trainer::launch(int64_t step, bool record) {
  // (--spare-workers: the handles keep the step's input state on the workers until it is reported.)
  std::vector<ArrayState> before = record && cfg_.mpmd.spare_workers > 0 ? states_ : std::vector<ArrayState>{};
  // (The runtime's count is read once per step: the previous step's reading is this one's start;
  // this client puts nothing else, route() being its only put.)
  if (cfg_.model.moe() && !puts_) puts_ = client_.usage().puts;
  const auto out = run_step();
  constexpr size_t kCount = StepOutputs<Array>::kCount;
  PWM_CHECK_EQ(out.size(), states_.size() * kCount + expert_states_.size() * ArrayState::kCount);
  for (size_t j = 0; j < expert_states_.size(); ++j)  // (the experts' devices' next states follow)
    expert_states_[j] = ArrayState::from(std::span(out).subspan(states_.size() * kCount + j * ArrayState::kCount));
  Pending p{step, {}, 0, {}};
  // The controller's round trips of this step, as the runtime counted them: the routing matrices
  // it put back (one per MoE layer and micro-batch with --moe-routing controller; none else).
  if (cfg_.model.moe()) {
    const uint64_t puts = client_.usage().puts;
    p.round_trips = puts - *puts_;
    puts_ = puts;
  }
  for (size_t s = 0; s < states_.size(); ++s) {  // each slice's StepOutputs, in slice order
    const auto o = StepOutputs<Array>::from(std::span(out).subspan(s * kCount, kCount));
    states_[s] = o.state;
    p.stats.push_back(o.stats);
  }
  p.inputs = std::move(before);
  if (record) pending_.push_back(std::move(p));
}

bool Trainer::drain() {
  while (!pending_.empty())
    if (!drain_one()) return false;
  return true;
}

void Trainer::fail() { stop_error_ = report_->stop(); }

bool Trainer::drain_one() {
  std::vector<std::vector<double>> per_slice;
  while (per_slice.empty()) {
    try {
      for (auto& a : pending_.front().stats) per_slice.push_back(fetch(a, fmt::format("step {}", pending_.front().step)));
    } catch (const std::exception& e) {
      if (!recover(e.what())) throw;
      per_slice.clear();
    }
  }
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  std::vector<StepStats> devices;  // every device of every slice
  for (auto& s : per_slice)
    for (const StepStats& d : StepStats::read_all(s, sh_.stats_words())) devices.push_back(d);
  const StepStats last = StepStats::read_all(per_slice.back(), sh_.stats_words()).front();  // the loss is on the last slice
  programs::StepTiming timing = programs::step_timing(p.step, devices, last, &last_end_us_);
  pwm::train::StepRecord& r = timing.record;
  if (pipe_) bubbles_.push_back(timing.bubble);
  if (R_ > 1 && !pipe_) record_overlap(devices);  // (the pipeline's update does not time the exchange)
  if (cfg_.model.moe()) r.moe = programs::moe_record(devices, cfg_, p.round_trips);
  report_->step(r);
  // A failed metrics write (a full disk) ends the run now rather than after the last step; the
  // controller's error ends the job (run_mpi_main) and nothing is left under the final name.
  if (report_->failed()) throw Error(report_->error());
  return !report_->stopped();
}

void Trainer::record_overlap(const std::vector<StepStats>& devices) {
  const programs::ExchangeTimes t = programs::exchange_times(devices);  // (the controller's clock: rank 0's)
  exposed_.push_back(t.exposed_ms);
  tails_.push_back(t.tail_ms);
}

// A full-model view for evaluation, hashing and checkpoints (the pipeline merges its stages).
// (Replica r's; every replica holds the same bits, checked at the end.)
Array Trainer::merged(Array ArrayState::*which, int r) {
  if (!expert_states_.empty()) {  // the dense slice's arrays with each rank's experts from its experts' device
    std::vector<Array> in{states_[0].*which};
    for (auto& s : expert_states_) in.push_back(s.*which);
    return dispatch(single(names_("expert_merge"), slices_[0], in, {cfg_.mesh.tp}), in, "merge")[0];
  }
  if (!pipe_) return states_[static_cast<size_t>(r)].*which;
  std::vector<Array> in;
  for (int s = 0; s < S_; ++s) in.push_back(states_[static_cast<size_t>(r * S_ + s)].*which);
  return dispatch(single(names_("merge"), slices_[static_cast<size_t>(r * S_)], in, {cfg_.mesh.tp}), in, "merge")[0];
}

double Trainer::evaluate() {
  const int tp = cfg_.mesh.tp;
  if (R_ == 1) {
    const Array params = merged(&ArrayState::params);
    return fetch(dispatch(single(names_("eval"), slices_[0], {params}, {tp}), {params}, "eval")[0], "val loss")[0];
  }
  // Every replica evaluates its rows of its own (identical) parameters; replica 0 adds.
  std::vector<Array> params;
  for (int r = 0; r < R_; ++r) params.push_back(merged(&ArrayState::params, r));
  ProgramBuilder b("eval-replicas");
  std::vector<Value> sums;
  for (int r = 0; r < R_; ++r)
    sums.push_back(b.call(names_("eval"), slices_[static_cast<size_t>(r * S_)], {b.param_like(params[static_cast<size_t>(r)])},
                          {tp, r})[0]);
  b.output(b.call(names_("val_total"), slices_[0], sums, {tp, R_})[0]);
  return fetch(dispatch(b.build(), params, "eval")[0], "val loss")[0];
}

double Trainer::probe_workers(double budget_s) {  // (0: the start-up probe)
  // Every slice's devices at once (the programs run side by side), then the mean over all.
  const int64_t budget_us = static_cast<int64_t>(budget_s * 1e6);
  std::vector<Array> rates;
  for (auto& sl : slices_)
    rates.push_back(dispatch(single(names_("gemm_probe"), sl, {}, {cfg_.mesh.tp, budget_us}), {}, "gemm probe")[0]);
  double sum = 0, n = 0;
  for (auto& a : rates)
    for (double r : fetch(a, "gemm probe")) {
      sum += r;
      ++n;
    }
  return sum / n;
}

void Trainer::probe_peak() {
  if (report_->peak().is_given()) return;  // --peak-gflops: the workers make no probe
  report_->probed(probe_workers(pwm::train::kPeakProbeBudgetS));
}

bool Trainer::save(int64_t steps_done) {  // (the state's own step counter is written)
  const ArrayState full{merged(&ArrayState::params), merged(&ArrayState::m), merged(&ArrayState::v), states_[0].step};
  dispatch(single(names_("save"), slices_[0], full.list(), {cfg_.mesh.tp}), full.list(), "checkpoint")[0].wait();
  saved_step_ = steps_done;
  return true;  // a failed write throws on the worker, which ends the job with one line
}

std::string Trainer::hash_of(int r) {
  const Array p = merged(&ArrayState::params, r);
  const auto hv = dispatch(single(names_("hash"), slices_[static_cast<size_t>(r * S_)], {p}, {cfg_.mesh.tp}), {p}, "hash")[0]
                      .get<int64_t>();
  uint64_t hash;
  std::memcpy(&hash, hv.data(), sizeof(hash));
  return pwm::train::hash_hex(hash);
}

std::optional<std::string> Trainer::finish() {
  const std::string h = hash_of(0);
  // Replicas: no parameter was ever sent between the islands; every island must still hold the
  // same bits (the same summed gradients, the same update). Checked once, at the end of the run.
  for (int r = 1; r < R_; ++r)
    if (hash_of(r) != h)
      throw Error(fmt::format("replica {}'s parameters differ from replica 0's after {} steps (the islands' updates "
                              "diverged): a bug in the exchange", r, cfg_.workload.steps));
  if (!cfg_.outputs.trace.empty()) write_trace();
  report_->finish(h);
  return h;
}

void Trainer::report_layout_and_memory() {
  const int tp = cfg_.mesh.tp;
  if (cfg_.mpmd.spare_workers > 0) {  // in-job recoveries: each one's seconds and the steps it ran again
    report_->set_extra("recoveries", static_cast<double>(recovery_s_.size()));
    report_->set_extra_list("recovery_s", recovery_s_);
    report_->set_extra_list("recovery_steps_run_again", recovery_steps_);
    if (R_ > 1 || replicas_dropped_ > 0) {  // (going on with fewer replicas: docs/failures.md)
      report_->set_extra("replicas_dropped", static_cast<double>(replicas_dropped_));
      report_->set_extra("replicas_left", static_cast<double>(R_));
    }
  }
  if (pipe_ && !bubbles_.empty()) {
    report_->set_extra("bubble", median(bubbles_));
    report_->set_extra("bubble_bound", static_cast<double>(S_ - 1) / static_cast<double>(cfg_.workload.microbatches + S_ - 1));
  }
  // Memory: every worker's peak resident set, after the last step and before the final
  // evaluation and checkpoint (as spmd_train's: their whole-model buffers are not training
  // state), and the model state each device holds.
  int64_t peak_rss = 0, gathered = 0;  // (memory: [rss, held beyond the arrays] per device)
  for (auto& sl : all_slices()) {
    const std::vector<int64_t> m = dispatch(single(names_("memory"), sl, {}, {tp}), {}, "memory")[0].get<int64_t>();
    for (size_t i = 0; i + 1 < m.size(); i += 2) {
      peak_rss = std::max(peak_rss, m[i]);
      gathered = std::max(gathered, m[i + 1]);
    }
  }
  report_->set_extra("peak_rss_bytes", static_cast<double>(peak_rss));
  // Per slice (a pipeline: per stage), the largest of its workers' object-store high-water marks
  // and of their intermediates (activations, gradients in flight) alive at once.
  std::map<int, WorkerStats> by_rank;
  for (const WorkerStats& w : client_.stats()) by_rank[w.rank] = w;
  std::vector<double> store, inter;
  for (auto& sl : all_slices()) {
    uint64_t hw = 0, in = 0;
    for (int d : sl.devices()) {
      const WorkerStats& w = by_rank[d + 1];  // device d is world rank d + 1
      hw = std::max(hw, w.high_water_bytes);
      in = std::max(in, w.peak_intermediate_bytes);
    }
    store.push_back(static_cast<double>(hw));
    inter.push_back(static_cast<double>(in));
  }
  report_->set_extra_list("peak_store_bytes", store);
  report_->set_extra_list("peak_intermediate_bytes", inter);
  if (pipe_) {  // the stage layout: S slices of dp x tp devices per replica, and the island of each
    report_->set_extra("stages", S_);
    report_->set_extra("stage_dp", cfg_.mesh.dp);
    report_->set_extra("stage_tp", tp);
    std::vector<double> isl;
    for (auto& sl : slices_) isl.push_back(sl.island());
    report_->set_extra_list("stage_islands", isl);
  }
  // (A pipeline stage's state arrays are the whole layout's size: sh.total(1).)
  // The model state a device holds (docs/train.md, as spmd_train's): parameters, gradients and
  // both AdamW moments of its shard, 16 bytes a parameter.
  // --fsdp: of its dp shard, plus the most gathered weights and gradients it held at once: the
  // kernels' own (fused's step, every evaluation), or at chained and opbyop the step program's
  // arrays and the tied pieces (never at the same time as an evaluation's).
  report_->set_extra("state_bytes", 4.0 * static_cast<double>(sh_.state_floats(tp)) * sizeof(float) +
                                        static_cast<double>(std::max(gathered, fsdp_program_held_)));
  if (R_ > 1) {
    // Bytes between islands per step (programs/replicas.cc: each device its 1/dp of a piece).
    report_->set_extra("dcn_bytes_per_step", programs::replica_bytes_per_step(sh_, devices_));
    if (!exposed_.empty()) report_->set_extra("xchg_exposed_ms", median(exposed_));
    if (!tails_.empty()) report_->set_extra("xchg_tail_ms", median(tails_));
  }
}

void Trainer::write_trace() {
  // Every worker's kernel spans plus the controller's dispatch and wait rows.
  std::vector<std::string> fragments{trace_.fragment()};
  const int64_t words = 1 << 20;  // 8 MiB of trace per worker at most
  for (auto& sl : all_slices()) {
    auto all = dispatch(single(names_("trace"), sl, {}, {cfg_.mesh.tp, words}), {}, "trace")[0].get<int64_t>();
    for (size_t d = 0; d + words <= all.size(); d += words)
      fragments.emplace_back(reinterpret_cast<const char*>(&all[d + 1]), static_cast<size_t>(all[d]));
  }
  write_trace_file(cfg_.outputs.trace, fragments, "--trace");
}

std::string run_controller(std::shared_ptr<collectives::Transport> transport, const pwm::train::TrainConfig& cfg,
                           bool resume, std::vector<int>* lost, std::function<void(int)> reshape) {
  RuntimeOptions ro = RuntimeOptions::from_env();
  ro.islands = cfg.mpmd.islands;
  ro.timeout_s = cfg.exec.coll_timeout;  // liveness: a silent worker ends the job after it
  ro.survive_worker_loss = cfg.mpmd.spare_workers > 0;  // (unless there are spares: Trainer::recover)
  // With replicas, a loss with no spare left goes on with one replica fewer (Trainer::recover).
  // (Not a pipeline's: a replica is S slices there, and its stages' shapes do not follow.)
  ro.survive_without_spare = ro.survive_worker_loss && cfg.mesh.replicas > 1 && cfg.mpmd.stages == 1;
  Runtime rt(transport, ro);
  const auto& m = cfg.mesh;
  const std::string replicas = m.replicas > 1 ? fmt::format(", replicas={}", m.replicas) : "";
  const std::string layout =
      cfg.mpmd.stages > 1 ? fmt::format("pipeline S={} {} of dp={} x tp={}{}", cfg.mpmd.stages,
                                        pwm::train::name(cfg.mpmd.schedule), m.dp, m.tp, replicas)
                          : fmt::format("{} replicas={} dp={} tp={}{}", pwm::train::name(cfg.mpmd.granularity),
                                        m.replicas, m.dp, m.tp,
                                        cfg.mpmd.expert_island && cfg.model.moe()
                                            ? fmt::format(", experts on {} devices of their own", m.ep)
                                            : "");
  Client client = rt.client("trainer");
  std::string stopped;
  {
    Trainer trainer(cfg, client, rt.num_islands(), resume);  // (the start-up GEMM probe is in it)
    trainer.on_fewer_replicas(std::move(reshape));
    pwm::train::print_header(
        "pathways", fmt::format("controller + {} workers ({} islands) | {}", transport->size() - 1, rt.num_islands(), layout),
        cfg, "", trainer.report().peak(), "worker");
    if (resume) fmt::print("[{}] resumed from {} at step {}\n", run_name(cfg), cfg.outputs.ckpt, trainer.first_step());
    if (!trainer.run()) stopped = trainer.stop_error();
  }
  rt.shutdown();  // (after the trainer has dropped its arrays: the steps still in flight end first)
  if (lost) *lost = rt.lost_workers();
  return stopped;
}

}  // namespace pwm::pathways::train
