#include "mpmd/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/stats.h"
#include "common/time.h"
#include "programs/pipeline.h"
#include "programs/replicas.h"
#include "programs/trace.h"
#include "train/full_state.h"
#include "train/peak.h"

namespace pwm::mpmd {

using dataflow::Value;
using programs::StepOutputs;
using programs::StepStats;
using train::Granularity;

const char* name(Model m) { return m == Model::kPathways ? "pathways" : "static"; }

std::string run_name(const train::TrainConfig& cfg, Model model) {
  if (cfg.mpmd.stages > 1) return fmt::format("{}-pipeline-{}", name(model), train::name(cfg.mpmd.schedule));
  return fmt::format("{}-{}", name(model), train::name(cfg.mpmd.granularity));
}

Trainer::Trainer(const train::TrainConfig& cfg, Backend& backend, bool resume, const programs::KernelNames& names)
    : cfg_(cfg), be_(backend), rt_(backend.runtime()), names_(names), pipe_(cfg.mpmd.stages > 1),
      R_(cfg.mesh.replicas), S_(cfg.mpmd.stages), devices_(cfg.mesh.dp * cfg.mesh.tp),
      sh_(cfg, programs::PipelineShape{cfg.mpmd.stages}) {
  place_slices();
  states_ = init_states(slices_, resume, Init::kSlices);
  expert_states_ = init_states(expert_slices_, resume, Init::kExperts);
  first_step_ = rt_.get<int64_t>(states_[0].step, "init")[0];
  if (resume) saved_step_ = first_step_;
  for (int sl : slices_) slice_devices_.push_back(rt_.devices(sl));
  const train::Peak peak = cfg.exec.peak_gflops > 0 ? train::Peak::given(cfg.exec.peak_gflops) : train::Peak::probed(probe(0));
  report_ = std::make_unique<train::TrainReport>(cfg, run_name(cfg, be_.model()), devices_ * R_ * S_, peak,
                                                 be_.writes_outputs());
  // Built once and loaded once: each run sends only ids and handles (a controller), or runs the
  // rank's prepared list (the static model).
  if (step_is_one_program()) step_ = rt_.load(step_program());
}

Trainer::~Trainer() = default;

std::optional<std::string> Trainer::run() {
  // (The loop's kill hook for a controller is world rank 0's; a worker kills itself inside its
  // step kernel: programs/step_kernels.cc.)
  return train::run(*this, cfg_, be_.rank());
}

void Trainer::place_slices() {
  const std::vector<int> mesh{cfg_.mesh.dp, cfg_.mesh.tp};
  const int islands = rt_.num_islands();
  if (pipe_) {
    // One island per stage (of every replica) when there are islands enough; else, with
    // replicas, replica r's stages on island r (mod the islands, as the replicas' slices below);
    // else stage s on island s while there are islands, the stages beyond on the least loaded
    // devices of any island (island s mod K could be a one-device island already holding a
    // stage while another island's devices idle).
    for (int r = 0; r < R_; ++r)
      for (int s = 0; s < S_; ++s) {
        const int i = r * S_ + s;
        const int island = R_ * S_ <= islands ? i : R_ > 1 ? r % islands : (s < islands ? s : -1);
        slices_.push_back(rt_.allocate(devices_, mesh, island));
      }
  } else if (R_ > 1) {  // replica r on island r (mod the islands: one island holds several in tests)
    for (int r = 0; r < R_; ++r) slices_.push_back(rt_.allocate(devices_, mesh, r % islands));
  } else if (sh_.expert_island()) {
    // The dense slice on island 0, the experts' devices on the next island (or beside it when
    // there is one island), each a slice of its own: device j's node takes every dense device's
    // block for it whole.
    slices_.push_back(rt_.allocate(devices_, mesh, 0));
    for (int j = 0; j < cfg_.mesh.ep; ++j) expert_slices_.push_back(rt_.allocate(1, {1, 1}, islands > 1 ? 1 : 0));
  } else {
    slices_.push_back(rt_.allocate(devices_, mesh, -1));
  }
}

std::vector<int> Trainer::all_slices() const {
  std::vector<int> all = slices_;
  all.insert(all.end(), expert_slices_.begin(), expert_slices_.end());
  return all;
}

std::vector<Array> Trainer::state_inputs() const {
  std::vector<Array> in;
  for (const auto* group : {&states_, &expert_states_})
    for (const ArrayState& s : *group)
      for (const Array& a : s.list()) in.push_back(a);
  return in;
}

// The parameters of a program over the states (state_inputs()'s order): every slice's, then
// (into `experts`) every experts' device's.
std::vector<Trainer::ValueState> Trainer::state_params(dataflow::Builder& b, std::vector<ValueState>* experts) const {
  const auto params = [&](const ArrayState& s) {
    std::vector<Value> v;
    for (const Array& a : s.list()) v.push_back(b.param(a.slice(), rt_.slice_size(a.slice()), a.spec()));
    return ValueState::from(v);
  };
  std::vector<ValueState> st;
  for (const ArrayState& s : states_) st.push_back(params(s));
  std::vector<ValueState> ex;
  for (const ArrayState& s : expert_states_) ex.push_back(params(s));
  if (experts) *experts = std::move(ex);
  return st;
}

dataflow::ExecutablePtr Trainer::cached(const std::string& key, const std::function<dataflow::ProgramDef()>& build) {
  auto it = programs_.find(key);
  if (it == programs_.end()) it = programs_.emplace(key, rt_.load(build())).first;
  return it->second;
}

std::vector<Array> Trainer::on_slices(const std::string& kernel, const std::vector<int>& slices,
                                      const std::function<std::vector<int64_t>(size_t)>& attrs, const std::string& what) {
  std::string key = kernel;
  for (size_t j = 0; j < slices.size(); ++j) key += fmt::format("|{}:{}", slices[j], fmt::join(attrs(j), ","));
  const auto exe = cached(key, [&] {
    dataflow::Builder b(kernel);
    for (size_t j = 0; j < slices.size(); ++j)
      for (const Value& v : b.call(kernel, slices[j], rt_.slice_size(slices[j]), {}, attrs(j))) b.output(v);
    return b.build();
  });
  return rt_.execute(*exe, {}, what);
}

// Each slice's state from init or load, the kernels' attrs by `what`: tp; an experts' device's
// index j; a recovery's -1, 1 (the slice's own tp positions, counted as a recovery's load).
std::vector<Trainer::ArrayState> Trainer::init_states(const std::vector<int>& slices, bool load, Init what) {
  if (slices.empty()) return {};
  const std::vector<Array> out = on_slices(
      names_(load ? "load" : "init"), slices,
      [&](size_t j) -> std::vector<int64_t> {
        switch (what) {
          case Init::kSlices: return {cfg_.mesh.tp};
          case Init::kExperts: return {cfg_.mesh.tp, static_cast<int64_t>(j)};
          case Init::kRecovery: return {cfg_.mesh.tp, -1, 1};
        }
        return {};
      },
      what == Init::kRecovery ? "restore" : "init");
  std::vector<ArrayState> st;
  for (size_t j = 0; j < slices.size(); ++j) st.push_back(ArrayState::from(std::span(out).subspan(j * ArrayState::kCount)));
  return st;
}

bool Trainer::controller_routing() const {
  return cfg_.model.moe() && cfg_.mpmd.routing(cfg_.model) == train::MoeRouting::kController;
}

bool Trainer::step_is_one_program() const {
  return pipe_ || R_ > 1 || cfg_.mpmd.granularity == Granularity::kFused ||
         (cfg_.mpmd.granularity == Granularity::kChained && !controller_routing());
}

std::string Trainer::step_name() const {
  if (be_.model() == Model::kStatic)
    return pipe_ ? "static-" + programs::pipeline_name(sh_, cfg_.mpmd.schedule) : run_name(cfg_, Model::kStatic) + "-step";
  if (pipe_) return programs::pipeline_name(sh_, cfg_.mpmd.schedule);
  if (R_ > 1) return programs::replica_name(cfg_.mpmd.granularity, R_);
  return cfg_.mpmd.granularity == Granularity::kFused ? names_("fused_step") : "chained-step";
}

dataflow::ProgramDef Trainer::step_program() const {
  dataflow::Builder b(step_name());
  std::vector<ValueState> experts;
  const std::vector<ValueState> st = state_params(b, &experts);
  const programs::SliceCall call = [&](int i, const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
    const int s = slices_.at(static_cast<size_t>(i));
    return b.call(k, s, rt_.slice_size(s), in, std::move(at));
  };
  std::vector<Value> out;
  if (pipe_) {
    out = programs::trace_pipeline_step(sh_, names_, cfg_.mpmd.schedule, st, call);
  } else if (R_ > 1) {
    out = programs::trace_replica_step(sh_, names_, cfg_.mpmd.granularity, st, call, &fsdp_program_held_);
  } else if (cfg_.mpmd.granularity == Granularity::kFused) {
    out = call(0, names_("fused_step"), st[0].list(), {cfg_.mesh.tp});
  } else {
    const programs::CallFn<Value> one = [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      return call(0, k, std::move(in), std::move(at));
    };
    programs::ExpertIsland<Value> isl;
    isl.states = experts;
    isl.call = [&](int j, const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      return b.call(k, expert_slices_.at(static_cast<size_t>(j)), 1, in, std::move(at));
    };
    out = programs::trace_step<Value>(sh_, names_, cfg_.mesh.tp, st[0], one, {}, &fsdp_program_held_,
                                      experts.empty() ? nullptr : &isl);
  }
  for (const Value& v : out) b.output(v);
  return b.build();
}

// --moe-routing controller: the trainer reads an MoE layer's counts (a round trip to the
// devices: every device's rows per expert, [dp, E]) and puts on each device what its block_fwd
// needs (Shapes::route_counts: the rows it will receive, then its own), 2E words a device.
Array Trainer::route(const Array& counts) {
  const std::vector<int64_t> rows = rt_.get<int64_t>(counts, "moe counts");
  const int64_t E = cfg_.model.experts, dp = cfg_.mesh.dp, P = cfg_.mesh.ep, per = E / P;
  std::vector<int64_t> put;
  put.reserve(static_cast<size_t>(dp * 2 * E));
  for (int64_t d = 0; d < dp; ++d) {
    const int64_t me = d % P, g0 = d - me;  // as TrainingDevice::ep_rank and ep_comm
    for (int64_t q = 0; q < P; ++q)
      for (int64_t j = 0; j < per; ++j) put.push_back(rows[static_cast<size_t>((g0 + q) * E + me * per + j)]);
    put.insert(put.end(), rows.begin() + d * E, rows.begin() + (d + 1) * E);
  }
  return rt_.put(slices_[0], dataflow::Sharding::kSplit, {collectives::DataType::kInt64, {dp * 2 * E}}, put.data());
}

// --expert-island with --moe-routing controller: the trainer reads the dense devices' counts
// for experts' device j (a round trip: [dp, El], each device's rows per expert of j) and puts
// them on that device, where expert_fwd reads them.
Array Trainer::island_route(const Array& counts, int j) {
  const std::vector<int64_t> rows = rt_.get<int64_t>(counts, "moe counts");
  return rt_.put(expert_slices_.at(static_cast<size_t>(j)), dataflow::Sharding::kReplicated,
                 {collectives::DataType::kInt64, {static_cast<int64_t>(rows.size())}}, rows.data());
}

// The step program's inputs: the state, donated (dataflow/runtime.h): the handles are moved out
// of states_ (launch() puts the step's outputs there), so the step's update may write the next
// state over this one, as spmd_train's does, and a device holds one copy of the state, not two.
// With --spare-workers the input state is kept for a recovery (launch's `before`): copies.
std::vector<Array> Trainer::donated_state() {
  if (cfg_.mpmd.spare_workers > 0) return state_inputs();
  std::vector<Array> in;
  for (auto* group : {&states_, &expert_states_})
    for (ArrayState& s : *group)
      for (Array* a : {&s.params, &s.m, &s.v, &s.step}) in.push_back(std::exchange(*a, Array{}));
  return in;
}

std::vector<Array> Trainer::run_step() {
  if (step_) return rt_.execute(*step_, donated_state(), "step");
  programs::RouteFn<Array> route;
  if (controller_routing()) route = [this](const Array& counts) { return this->route(counts); };
  if (cfg_.mpmd.granularity == Granularity::kOpByOp) {  // a call per node, each its own program
    const programs::CallFn<Array> call = [&](const std::string& k, std::vector<Array> in, std::vector<int64_t> at) {
      return rt_.call(k, slices_[0], in, std::move(at));
    };
    programs::ExpertIsland<Array> isl;
    isl.states = expert_states_;
    isl.call = [this](int j, const std::string& k, std::vector<Array> in, std::vector<int64_t> at) {
      return rt_.call(k, expert_slices_.at(static_cast<size_t>(j)), in, std::move(at));
    };
    if (route && !expert_slices_.empty()) {  // (the island's round trips: island_route)
      isl.route = [this](const Array& counts, int j) { return island_route(counts, j); };
      route = {};
    }
    return programs::trace_step<Array>(sh_, names_, cfg_.mesh.tp, states_[0], call, route, &fsdp_program_held_,
                                       expert_slices_.empty() ? nullptr : &isl);
  }
  // chained, cut at the routing (segmented_step): built on the first step
  if (!segmented_)
    segmented_ = std::make_unique<SegmentedStep>(
        segmented_step(rt_, sh_, names_, slices_[0], states_[0], expert_slices_, expert_states_));
  return segmented_->run(rt_, donated_state(), [&](const Array& counts, size_t i) {
    return expert_slices_.empty() ? this->route(counts) : island_route(counts, static_cast<int>(i));
  });
}

bool Trainer::step(int64_t step) {
  launch(step);
  // A controller keeps two steps in flight while it reads the statistics of the one before. A
  // worker answers a fetch only between kernels, so with one in flight a fused step (one kernel)
  // would have its predecessor's statistics fetched only when it ends, and the next step
  // dispatched only after that round trip: the devices would idle for it every step.
  // A failed metrics write throws from drain_one (the error ends the job); a non-finite step
  // beyond --skip-nonfinite returns false (the steps after it, in flight, are never reported:
  // the run ends before anything else).
  return pending_.size() <= static_cast<size_t>(be_.steps_in_flight()) || drain_one();
}

void Trainer::launch(int64_t step, bool record) {
  // (--spare-workers: the handles keep the step's input state on the devices until it is reported.)
  std::vector<ArrayState> before = record && cfg_.mpmd.spare_workers > 0 ? states_ : std::vector<ArrayState>{};
  // (The runtime's count is read once per step: the previous step's reading is this one's start;
  // the trainer puts nothing else, route() being its only put.)
  if (cfg_.model.moe() && !puts_) puts_ = rt_.puts();
  const auto out = run_step();
  constexpr size_t kCount = StepOutputs<Array>::kCount;
  PWM_CHECK_EQ(out.size(), states_.size() * kCount + expert_states_.size() * ArrayState::kCount);
  for (size_t j = 0; j < expert_states_.size(); ++j)  // (the experts' devices' next states follow)
    expert_states_[j] = ArrayState::from(std::span(out).subspan(states_.size() * kCount + j * ArrayState::kCount));
  Pending p{step, {}, 0, {}};
  // The controller's round trips of this step, as the runtime counted them: the routing matrices
  // it put back (one per MoE layer and micro-batch with --moe-routing controller; none else).
  if (cfg_.model.moe()) {
    const uint64_t puts = rt_.puts();
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

bool Trainer::drain_one() {
  std::vector<dataflow::HostValue> per_slice;
  while (per_slice.empty()) {
    try {
      per_slice = rt_.fetch(pending_.front().stats, fmt::format("step {}", pending_.front().step));
    } catch (const std::exception& e) {
      if (!recover(e.what())) throw;
      per_slice.clear();
    }
  }
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  std::vector<StepStats> devices;  // every device of every slice
  for (auto& s : per_slice)
    for (const StepStats& d : StepStats::read_all(s.as<double>(), sh_.stats_words())) devices.push_back(d);
  // (the loss is on the last slice)
  const StepStats last = StepStats::read_all(per_slice.back().as<double>(), sh_.stats_words()).front();
  programs::StepTiming timing = programs::step_timing(p.step, devices, last, &last_end_us_);
  train::StepRecord& r = timing.record;
  if (pipe_) bubbles_.push_back(timing.bubble);
  if (R_ > 1 && !pipe_) {  // (the pipeline's update does not time the exchange)
    const programs::ExchangeTimes x = programs::exchange_times(devices);
    exposed_.push_back(x.exposed_ms);
    tails_.push_back(x.tail_ms);
  }
  if (cfg_.model.moe()) r.moe = programs::moe_record(devices, cfg_, p.round_trips);
  report_->step(r);
  // A failed metrics write (a full disk) ends the run now rather than after the last step; the
  // error ends the job (run_mpi_main) and nothing is left under the final name.
  if (report_->failed()) throw Error(report_->error());
  return !report_->stopped();
}

}  // namespace pwm::mpmd
