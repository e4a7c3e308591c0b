#include "programs/step_io.h"

#include <algorithm>
#include <cstring>

#include "model/transformer.h"
#include "train/fsdp.h"

namespace pwm::programs {

std::string KernelNames::unit(const model::Unit& u, int tp, bool expert_exchange) const {
  // Kernels with tp collectives carry "_tp", with the experts' AllToAll "_ep" (gang-scheduled);
  // a backward unit of a later micro-batch adds to the previous one's gradient piece ("_acc",
  // one input more).
  std::string k = model::unit_kind_name(u.kind);
  const bool block = u.kind == model::UnitKind::kBlockForward || u.kind == model::UnitKind::kBlockBackward;
  if (block && tp > 1) k += "_tp";
  if (block && expert_exchange) k += "_ep";
  const bool acc = u.micro > 0 && (u.kind == model::UnitKind::kHead || u.kind == model::UnitKind::kBlockBackward);
  if (acc) k += "_acc";
  return (*this)(k);
}

Shapes::Shapes(const pwm::train::TrainConfig& cfg, PipelineShape pipe) : cfg_(cfg), pipe_(pipe) {
  layouts_.emplace_back(cfg.model, 0, 1, 0, cfg.mesh.ep);  // (an MoE model runs at tp = 1)
  if (cfg.mesh.tp > 1) layouts_.emplace_back(cfg.model, 0, cfg.mesh.tp);
  for (const auto& l : layouts_) plans_.emplace_back(l, cfg.workload.microbatches);
}

const model::ParamLayout& Shapes::layout(int tp) const {
  for (const auto& l : layouts_)
    if (l.tp_size() == tp) return l;
  PWM_THROW("no layout for tp = {} (the workload has tp = {})", tp, cfg_.mesh.tp);
}

const model::StepPlan& Shapes::plan(int tp) const {
  for (size_t i = 0; i < layouts_.size(); ++i)
    if (layouts_[i].tp_size() == tp) return plans_[i];
  PWM_THROW("no plan for tp = {} (the workload has tp = {})", tp, cfg_.mesh.tp);
}

ArgSpec Shapes::route_counts() const { return {TensorSpec{DataType::kInt64, {2 * cfg_.model.experts}}, Sharding::kSplit}; }

int64_t Shapes::stats_words() const { return StepStats::words(cfg_.model.experts, StepStats::calls(cfg_)); }

int64_t Shapes::saved(int tp) const { return model::Activations<float>::layer_elements(layout(tp), cfg_.micro_batch()); }

int64_t Shapes::state_floats(int tp) const {
  return cfg_.mesh.fsdp ? pwm::train::Fsdp::shard_total(layout(tp), cfg_.mesh.dp) : total(tp);
}

int64_t Shapes::fsdp_chunk(int tp, int i) const {
  return pwm::train::Fsdp::chunk_sizes(layout(tp), cfg_.mesh.dp).at(static_cast<size_t>(i));
}

std::vector<ArgSpec> Shapes::state(int tp) const {
  const int64_t n = state_floats(tp);
  return {split_f32(n), split_f32(n), split_f32(n), rep_i64(1)};
}

ArgSpec split_f32(int64_t n) { return {TensorSpec{DataType::kFloat32, {n}}, Sharding::kSplit}; }
ArgSpec split_f64(int64_t n) { return {TensorSpec{DataType::kFloat64, {n}}, Sharding::kSplit}; }
ArgSpec split_i32(int64_t n) { return {TensorSpec{DataType::kInt32, {n}}, Sharding::kSplit}; }
ArgSpec rep_i64(int64_t n) { return {TensorSpec{DataType::kInt64, {n}}, Sharding::kReplicated}; }
ArgSpec rep_f32(int64_t n) { return {TensorSpec{DataType::kFloat32, {n}}, Sharding::kReplicated}; }
ArgSpec rep_f64(int64_t n) { return {TensorSpec{DataType::kFloat64, {n}}, Sharding::kReplicated}; }

int64_t Shapes::island_rows() const {
  const model::Config& m = cfg_.model;
  const int64_t N = cfg_.micro_batch() * m.seq_len, El = m.experts / cfg_.mesh.ep;
  return m.capacity_factor > 0 ? El * m.expert_capacity(N) : N * std::min<int64_t>(m.top_k, El);
}
// The blocks' readers take the used rows only (the rows first; their counts cross beside them):
// a dropless block crosses with its rows, not island_rows() (KernelContext::set_used).
ArgSpec Shapes::island_block() const {
  ArgSpec a = split_f32(island_rows() * cfg_.model.d_model);
  a.prefix = true;
  return a;
}
ArgSpec Shapes::island_counts() const {
  return {TensorSpec{DataType::kInt64, {cfg_.model.experts / cfg_.mesh.ep}}, Sharding::kSplit};
}
ArgSpec Shapes::island_blocks() const {
  ArgSpec a = rep_f32(cfg_.mesh.dp * island_rows() * cfg_.model.d_model);
  a.prefix = true;
  return a;
}
ArgSpec Shapes::island_blocks_counts() const { return rep_i64(cfg_.mesh.dp * (cfg_.model.experts / cfg_.mesh.ep)); }

void StepStats::write(std::span<double> o) const {
  PWM_CHECK_EQ(o.size(), static_cast<size_t>(kWords) + moe.size());
  const double w[kWords] = {loss, grad_norm, lr, compute_ms, comm_ms, kernel_ms, busy_ms, end_us, xchg_exposed_ms, bwd_end_us, update_start_us};
  std::copy(w, w + kWords, o.begin());
  std::copy(moe.begin(), moe.end(), o.begin() + kWords);
}

StepStats StepStats::read(std::span<const double> i) {
  PWM_CHECK(static_cast<int64_t>(i.size()) >= kWords, "step statistics of {} words", i.size());
  return {i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], {i.begin() + kWords, i.end()}};
}

std::vector<StepStats> StepStats::read_all(const std::vector<double>& all, int64_t words) {
  const size_t w = static_cast<size_t>(words);
  PWM_CHECK(all.size() % w == 0, "statistics of {} words are not whole devices", all.size());
  std::vector<StepStats> s;
  for (size_t d = 0; d < all.size(); d += w) s.push_back(read(std::span<const double>(all).subspan(d, w)));
  return s;
}

StageLayers stage_layers(const Shapes& sh, int stage) {
  const int L = static_cast<int>(sh.cfg().model.n_layers);
  return {sh.pipe().layer_begin(stage, L), sh.pipe().layer_begin(stage + 1, L)};
}

UpdateArgs replica_update_args(const Shapes& sh, int tp, bool fsdp_chunks) {
  const size_t shard = fsdp_chunks ? static_cast<size_t>(sh.cfg().model.n_layers) + 2 : 1;
  const size_t pieces = sh.cfg().mesh.fsdp ? shard : static_cast<size_t>(sh.plan(tp).num_pieces());
  return {pieces, static_cast<size_t>(sh.cfg().mesh.replicas), false};
}

void copy_chunk(std::span<const float> src, int k, std::span<float> dst) {
  const size_t c = dst.size(), begin = std::min(src.size(), static_cast<size_t>(k) * c);
  const size_t n = std::min(c, src.size() - begin);
  std::memcpy(dst.data(), src.data() + begin, sizeof(float) * n);
  std::fill(dst.begin() + static_cast<std::ptrdiff_t>(n), dst.end(), 0.0f);
}

UpdateArgs update_args(const Shapes& sh, int tp) {
  return {static_cast<size_t>(sh.plan(tp).num_pieces()), static_cast<size_t>(sh.cfg().workload.microbatches), false};
}

UpdateArgs pipe_update_args(const Shapes& sh, int stage) {
  const StageLayers s = stage_layers(sh, stage);
  const bool last = stage == sh.pipe().stages - 1;
  return {static_cast<size_t>(1 + s.end - s.begin), last ? static_cast<size_t>(sh.cfg().mesh.replicas) : 0, true};
}

StepTiming step_timing(int64_t step, const std::vector<StepStats>& devices, const StepStats& last, double* last_end_us) {
  double end_us = 0, first_busy = 0;
  for (const StepStats& d : devices) {
    end_us = std::max(end_us, d.end_us);
    first_busy = std::max(first_busy, d.busy_ms);
  }
  StepTiming t;
  pwm::train::StepRecord& r = t.record;
  r.step = step;
  r.step_ms = *last_end_us < 0 ? first_busy : (end_us - *last_end_us) * 1e-3;
  *last_end_us = end_us;
  r.loss = last.loss;
  r.grad_norm = last.grad_norm;
  r.lr = last.lr;
  double busy_sum = 0;
  for (const StepStats& d : devices) {
    const double busy = std::min(d.busy_ms, r.step_ms);
    r.compute_ms.push_back(busy - d.comm_ms);
    r.comm_ms.push_back(d.comm_ms + (r.step_ms - busy));
    r.wait_ms.push_back(r.step_ms - busy);
    busy_sum += busy;
  }
  t.bubble = 1.0 - busy_sum / static_cast<double>(devices.size()) / r.step_ms;
  return t;
}

ExchangeTimes exchange_times(const std::vector<StepStats>& devices) {
  ExchangeTimes t;
  if (devices.empty()) return t;
  const double n = static_cast<double>(devices.size());
  double last_bwd = 0;
  for (const StepStats& d : devices) {
    t.exposed_ms += d.xchg_exposed_ms / n;
    last_bwd = std::max(last_bwd, d.bwd_end_us);
  }
  for (const StepStats& d : devices) t.tail_ms += std::max(0.0, d.update_start_us - last_bwd) * 1e-3 / n;
  return t;
}

pwm::train::MoeRecord moe_record(const std::vector<StepStats>& devices, const pwm::train::TrainConfig& cfg,
                                 uint64_t round_trips) {
  std::vector<double> sum;
  std::vector<double> alltoall_ms, wait_ms;
  for (const StepStats& d : devices) {
    PWM_CHECK(d.moe.size() >= 7, "an MoE step's statistics without its MoE words");
    const size_t n = d.moe.size() - 2;  // pack_moe_stats, then the AllToAll and routing-wait times
    sum.resize(n, 0.0);
    for (size_t i = 0; i < n; ++i) sum[i] += d.moe[i];
    alltoall_ms.push_back(d.moe[n]);
    wait_ms.push_back(d.moe[n + 1]);
  }
  pwm::train::MoeRecord r = pwm::train::moe_record(sum, cfg);
  r.alltoall_ms = alltoall_ms;
  r.round_trips = static_cast<double>(round_trips);
  r.route_wait_ms = wait_ms;
  return r;
}

double replica_bytes_per_step(const Shapes& sh, int devices_per_replica) {
  const pwm::train::TrainConfig& cfg = sh.cfg();
  const int tp = cfg.mesh.tp, R = cfg.mesh.replicas;
  int64_t piece_bytes = 0;
  for (int i = 0; i < sh.plan(tp).num_pieces(); ++i)
    piece_bytes += static_cast<int64_t>(replica_chunk(sh.piece(tp, i), cfg.mesh.dp) * sizeof(float));
  if (cfg.mesh.fsdp) piece_bytes = sh.state_floats(tp) * static_cast<int64_t>(sizeof(float));
  return static_cast<double>(R) * (R - 1) * devices_per_replica * static_cast<double>(piece_bytes + sizeof(double));
}

}  // namespace pwm::programs
