#include "programs/device.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/time.h"
#include "dataflow/buffer.h"
#include "train/expert_comm.h"
#include "train/peak.h"
#include "train/report.h"

namespace pwm::programs {

using collectives::Communicator;

namespace {
// The sub-groups' contexts follow the slice's (dataflow::kSliceSubContexts).
enum SubContext : uint32_t { kTpContext = 1, kDpContext = 2, kEpContext = 3, kExpertContext = 4 };
static_assert(kExpertContext <= dataflow::kSliceSubContexts);
uint32_t sub_context(KernelContext& ctx, SubContext k) { return ctx.comm().context() + k; }
}  // namespace

Pos Pos::of(const KernelContext& ctx, int tp) {
  const int n = ctx.num_shards();
  return {n / tp, tp, ctx.shard() / tp, ctx.shard() % tp};
}

TrainingDevice::TrainingDevice(const Shapes& shapes, std::shared_ptr<collectives::Transport> transport,
                               std::shared_ptr<const pwm::train::TextDataset> data)
    : shapes_(shapes), transport_(std::move(transport)), data_(std::move(data)), flat_cfg_(shapes.cfg()) {
  flat_cfg_.mesh.dp = flat_cfg_.data_parallel();
  flat_cfg_.mesh.replicas = 1;
  clock_offset_us_ = transport_->clock_offset_us(transport_->rank());
  straggler_ = cfg().hooks.straggles(transport_->rank());
  if (!cfg().outputs.trace.empty()) {
    // The trace's origin is this rank's clock offset to rank 0 (the controller): its timestamps
    // are then on the controller's clock, whichever host this worker runs on.
    const int r = transport_->rank();
    trace_ = std::make_unique<Trace>(true, r, transport_->clock_offset_us(r));
    const std::string host = transport_->host_of(r);
    trace_->process_name(fmt::format("worker rank {} (device {}){}", r, r - 1, host.empty() ? "" : " on " + host));
  }
}

void TrainingDevice::reshaped() {
  flat_cfg_ = shapes_.cfg();
  flat_cfg_.mesh.dp = flat_cfg_.data_parallel();
  flat_cfg_.mesh.replicas = 1;
  ws_.reset();
  piece_parts_.clear();
}

const pwm::train::TextDataset& TrainingDevice::data() const {
  PWM_CHECK(data_ != nullptr, "this training device has no dataset");
  return *data_;
}

const model::ParamLayout& TrainingDevice::layout(const Pos& p) {
  const auto key = std::make_tuple(p.tp, p.tp_rank, ep_rank(p));
  auto it = layouts_.find(key);
  if (it == layouts_.end())
    it = layouts_.emplace(key, model::ParamLayout(cfg().model, p.tp_rank, p.tp, ep_rank(p), cfg().mesh.ep)).first;
  return it->second;
}

const TrainingDevice::PieceParts& TrainingDevice::piece_parts(const Pos& p, int piece) {
  const auto key = std::make_tuple(p.tp, p.tp_rank, ep_rank(p), piece);
  auto it = piece_parts_.find(key);
  if (it != piece_parts_.end()) return it->second;
  using collectives::BucketedAllreduce;
  const model::StepPlan& plan = shapes_.plan(p.tp);
  std::vector<BucketedAllreduce::Range> dense = plan.finish_order(), experts;
  if (cfg().mesh.ep > 1) {
    pwm::train::ExpertSplit split = pwm::train::split_experts(layout(p), dense);
    dense = std::move(split.dense);
    experts = std::move(split.experts);
  }
  auto parts = [&](const std::vector<BucketedAllreduce::Range>& units) {
    if (units.empty()) return std::vector<BucketedAllreduce::Part>{};
    return BucketedAllreduce::parts(BucketedAllreduce::cut(units, cfg().exec.bucket_bytes), plan.piece_ranges(piece));
  };
  return piece_parts_.emplace(key, PieceParts{parts(dense), parts(experts)}).first->second;
}

model::Workspace<float>& TrainingDevice::step_memory(const model::ParamLayout& layout) {
  grads_n_ = layout.total();
  tokens_.resize(static_cast<size_t>(shapes_.tokens()));
  if (!ws_) ws_ = std::make_unique<model::Workspace<float>>(layout, cfg().micro_batch());
  return *ws_;
}

float* TrainingDevice::grads() {
  PWM_CHECK(grads_n_ > 0, "the gradient buffer taken before the step memory");
  if (grads_.empty()) grads_.resize(static_cast<size_t>(grads_n_));
  return grads_.data();
}

bool TrainingDevice::steps_of_units() const {
  return cfg().mpmd.granularity != pwm::train::Granularity::kFused || cfg().mpmd.stages > 1;
}

pwm::train::Fsdp& TrainingDevice::fsdp(KernelContext& ctx, const Pos& p) {
  if (!fsdp_) {
    // One island: no replicas' communicator (a cross-island sum is the program's, not a kernel's).
    fsdp_ = std::make_unique<pwm::train::Fsdp>(cfg(), layout(p), shapes_.plan(p.tp), dp_comm(ctx, p), nullptr);
  }
  return *fsdp_;
}

float* TrainingDevice::fsdp_grads(KernelContext& ctx, const Pos& p) {
  if (fsdp_grads_.empty()) fsdp_grads_.assign(static_cast<size_t>(fsdp(ctx, p).shard_total()), 0.0f);
  return fsdp_grads_.data();
}

model::GemmProbe* TrainingDevice::gemm_probe() {
  if (!probe_made_) probe_ = pwm::train::make_gemm_probe(cfg());
  probe_made_ = true;
  return probe_.get();
}

Communicator& TrainingDevice::comm(uint32_t context, std::vector<int> group) {
  auto& c = comms_[{context, group}];
  if (!c) {
    collectives::CommOptions o = collectives::CommOptions::from_env();
    o.timeout_s = cfg().exec.coll_timeout;
    c = std::make_unique<Communicator>(transport_, group, context, o);
  }
  return *c;
}

void TrainingDevice::forget_contexts(uint32_t first, uint32_t n) {
  for (auto it = comms_.begin(); it != comms_.end();) {
    if (it->first.first >= first && it->first.first < first + n) {
      forgotten_comms_.push_back(std::move(it->second));
      it = comms_.erase(it);
    } else {
      ++it;
    }
  }
}

// Sub-groups of the slice communicator: tp ranks adjacent, as in spmd_train's mesh.
Communicator* TrainingDevice::tp_comm(KernelContext& ctx, const Pos& p) {
  if (p.tp == 1) return nullptr;
  std::vector<int> grp;
  for (int t = 0; t < p.tp; ++t) grp.push_back(ctx.comm().group()[p.dp_rank * p.tp + t]);
  return &comm(sub_context(ctx, kTpContext), grp);
}

Communicator* TrainingDevice::dp_comm(KernelContext& ctx, const Pos& p) {
  if (p.dp == 1) return nullptr;
  std::vector<int> grp;
  for (int d = 0; d < p.dp; ++d) grp.push_back(ctx.comm().group()[d * p.tp + p.tp_rank]);
  return &comm(sub_context(ctx, kDpContext), grp);
}

model::TpReduce<float> TrainingDevice::tp_reducer(Communicator* c, double* comm_s) {
  if (!c) return {};
  return [c, comm_s](float* d, size_t n) {
    const double t0 = now_s();
    c->allreduce(d, d, n, collectives::DataType::kFloat32, collectives::ReduceOp::kSum);
    *comm_s += now_s() - t0;
  };
}

// Expert parallelism (tp = 1, so a device's dp rank is its shard): P consecutive dp ranks split
// the experts; the ranks P apart hold the same ones. As spmd_train's Mesh::make.
Communicator* TrainingDevice::ep_comm(KernelContext& ctx, const Pos& p) {
  const int P = cfg().mesh.ep;
  if (P == 1) return nullptr;
  std::vector<int> grp;
  for (int j = 0; j < P; ++j) grp.push_back(ctx.comm().group()[(p.dp_rank - ep_rank(p) + j) * p.tp + p.tp_rank]);
  return &comm(sub_context(ctx, kEpContext), grp);
}

Communicator* TrainingDevice::expert_comm(KernelContext& ctx, const Pos& p) {
  const int P = cfg().mesh.ep;
  if (p.dp / P == 1) return nullptr;
  std::vector<int> grp;
  for (int i = ep_rank(p); i < p.dp; i += P) grp.push_back(ctx.comm().group()[i * p.tp + p.tp_rank]);
  return &comm(sub_context(ctx, kExpertContext), grp);
}

model::ExpertComm<float> TrainingDevice::expert_alltoall(KernelContext& ctx, const Pos& p, std::span<const int64_t> counts) {
  // The time is the step's communication and its AllToAll time.
  model::ExpertComm<float> e = pwm::train::expert_alltoall(ep_comm(ctx, p), {&comm_s_, &alltoall_s_}, trace_.get());
  if (e.size == 1 || counts.empty()) return e;
  // From the controller (Trainer::route): the rows this device receives for its experts from
  // each member of its group, then its own rows per expert (its router's: checked). No exchange.
  const int64_t E = cfg().model.experts;
  PWM_CHECK_EQ(static_cast<int64_t>(counts.size()), 2 * E);
  e.counts = [counts, E, P = e.size, dp = p.dp_rank](const int64_t* send, int64_t* recv, int64_t per) {
    for (int64_t x = 0; x < E; ++x)
      PWM_CHECK(send[x] == counts[static_cast<size_t>(E + x)],
                "moe: the controller's counts for device {} differ from its router's (expert {}: {} vs {})", dp, x,
                counts[static_cast<size_t>(E + x)], send[x]);
    PWM_CHECK_EQ(P * per, E);
    std::copy(counts.begin(), counts.begin() + E, recv);
  };
  return e;
}

// The states move, never copy; a state given back by take_moe is handed to the next keep_moe's
// caller, so the forward reuses its vectors' memory (tens of MB per layer at the reference model:
// freed and faulted in again each time, they cost as much as a small GEMM).
void TrainingDevice::routed(const KernelScope& running) {
  if (last_kernel_end_us_ >= 0) route_wait_s_ += std::max<int64_t>(0, running.start_us_ - last_kernel_end_us_) * 1e-6;
}

void TrainingDevice::waited_for_experts(const KernelScope& running) {
  if (last_kernel_end_us_ >= 0) alltoall_s_ += std::max<int64_t>(0, running.start_us_ - last_kernel_end_us_) * 1e-6;
}

void TrainingDevice::keep_moe(const float* saved, model::MoeState<float>& st) {
  PWM_CHECK(!moe_saved_.count(saved), "moe: a layer's state is kept twice for one saved(l) buffer");
  moe_saved_.emplace(saved, std::move(st));
  st = model::MoeState<float>{};
  if (!moe_spare_.empty()) {
    st = std::move(moe_spare_.back());
    moe_spare_.pop_back();
  }
}

void TrainingDevice::take_moe(const float* saved, model::MoeState<float>& st) {
  auto it = moe_saved_.find(saved);
  PWM_CHECK(it != moe_saved_.end(), "moe: no routing state kept for this layer's saved activations");
  moe_spare_.push_back(std::move(st));
  st = std::move(it->second);
  moe_saved_.erase(it);
}

void TrainingDevice::start_reduce(KernelContext& ctx, const Pos& p, std::span<const float> in, std::span<float> out,
                                   int layer) {
  PWM_CHECK_EQ(in.size(), out.size());
  Communicator* c = dp_comm(ctx, p);
  const int64_t t0 = now_us();
  PendingReduce r{{}, out.data(), layer, t0};
  if (c) {
    r.work = c->iallreduce(in.data(), out.data(), in.size(), collectives::DataType::kFloat32, collectives::ReduceOp::kSum);
  } else {
    std::memcpy(out.data(), in.data(), sizeof(float) * in.size());
  }
  reduces_.push_back(std::move(r));
  add_comm((now_us() - t0) * 1e-6);  // (the kernel wrapper's poll after this body tests it first)
}

void TrainingDevice::start_layer_reduce_scatter(KernelContext& ctx, const Pos& p, int layer, const float* grads,
                                                float* chunk) {
  const int64_t t0 = now_us();
  PendingReduce r{fsdp(ctx, p).start_reduce_layer(layer, grads, chunk), chunk, layer, t0};
  reduces_.push_back(std::move(r));
  add_comm((now_us() - t0) * 1e-6);
}

void TrainingDevice::reduce_done(PendingReduce& r) {
  r.done = true;
  if (trace_) trace_->span(fmt::format("dp_reduce layer {}", r.layer), "reduce", r.start_us, now_us());
}

void TrainingDevice::poll_reduces() {
  if (reduces_.empty()) return;
  const int64_t t0 = now_us();
  for (PendingReduce& r : reduces_)
    if (!r.done && (!r.work.valid() || r.work.test())) reduce_done(r);
  add_comm((now_us() - t0) * 1e-6);
}

void TrainingDevice::finish_reduce(const float* out) {
  PWM_CHECK(!reduces_.empty() && reduces_.front().out == out,
            "dp_reduce_finish: not the oldest started reduction (starts and finishes must pair in order)");
  const int64_t t0 = now_us();
  PendingReduce& r = reduces_.front();
  if (!r.done) {
    if (r.work.valid()) r.work.wait();
    reduce_done(r);
  }
  reduces_.pop_front();
  add_comm((now_us() - t0) * 1e-6);
}

void TrainingDevice::abandon_step() {
  for (PendingReduce& r : reduces_) r.work.abandon();  // (no wait: the peers may be gone)
  reduces_.clear();
  moe_saved_.clear();
  moe_ordered_.clear();
  moe_ = {};
  alltoall_s_ = route_wait_s_ = comm_s_ = busy_s_ = 0;
}

void TrainingDevice::report(KernelScope& running, pwm::train::UpdateResult u, double loss, double kernel_comm_s,
                            std::span<double> out, const StepStats* exchange) {
  const int64_t now = now_us();
  const double kernel_s = (now - running.start_us_) * 1e-6;
  StepStats s;
  s.loss = loss;
  s.grad_norm = u.grad_norm;
  s.lr = u.lr;
  // The step's communication: this kernel's, and the collectives of its earlier kernels
  // (chained and opbyop reduce gradients in kernels of their own).
  s.compute_ms = (kernel_s - kernel_comm_s) * 1e3;
  s.comm_ms = (kernel_comm_s + comm_s_) * 1e3;
  s.kernel_ms = kernel_s * 1e3;
  s.busy_ms = (busy_s_ + (now - running.counted_from_us_) * 1e-6) * 1e3;
  s.end_us = static_cast<double>(now_us());
  if (exchange) {
    s.xchg_exposed_ms = exchange->xchg_exposed_ms;
    s.bwd_end_us = exchange->bwd_end_us;
    s.update_start_us = exchange->update_start_us;
  }
  if (cfg().model.moe()) {
    for (const auto& [order, st] : moe_ordered_) moe_.add(st);
    moe_ordered_.clear();
    s.moe = pwm::train::pack_moe_stats(moe_, cfg().model.experts, StepStats::calls(cfg()));
    s.moe.push_back(alltoall_s_ * 1e3);
    s.moe.push_back(route_wait_s_ * 1e3);
    moe_ = {};
    alltoall_s_ = route_wait_s_ = 0;
  }
  comm_s_ = 0;
  busy_s_ = 0;
  straggled_ = false;
  running.counted_from_us_ = now;  // the rest of this kernel counts toward the next step
  s.write(out);
}

void TrainingDevice::backward_done(const KernelScope& running) {
  bwd_end_us_ = now_us();
  busy_at_bwd_s_ = busy_s_ + (bwd_end_us_ - running.counted_from_us_) * 1e-6;
}

double TrainingDevice::now_ctrl_us() const { return static_cast<double>(now_us() - clock_offset_us_); }

double TrainingDevice::exchange_exposed_s() const {
  if (bwd_end_us_ < 0) return 0;
  return std::max(0.0, (now_us() - bwd_end_us_) * 1e-6 - (busy_s_ - busy_at_bwd_s_));
}

TrainingDevice::KernelScope::KernelScope(TrainingDevice& dev, const std::string& name, bool step_work)
    : dev_(dev), name_(name), step_work_(step_work), start_us_(now_us()), counted_from_us_(start_us_) {
  // --straggler-ms: the device's first step kernel of each step takes that much longer (busy
  // time, as a slower device's compute).
  if (step_work_ && dev_.straggler_ && !dev_.straggled_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(dev_.cfg().hooks.straggler_ms));
    dev_.straggled_ = true;
  }
}

TrainingDevice::KernelScope::~KernelScope() {
  const int64_t end = now_us();
  if (step_work_) dev_.busy_s_ += (end - counted_from_us_) * 1e-6;
  dev_.last_kernel_end_us_ = end;
  if (dev_.trace_) {
    dev_.trace_->span(name_, "kernel", start_us_, end);
    // This worker's object store (one worker per process under MPI): its live buffers after the
    // kernel (its outputs included) and their high-water mark so far.
    dev_.trace_->counter("object store bytes", "live", end, static_cast<double>(dataflow::Buffer::live_bytes()));
    dev_.trace_->counter("object store high-water", "bytes", end, static_cast<double>(dataflow::Buffer::peak_live_bytes()));
  }
}

double TrainingDevice::KernelScope::elapsed_s() const { return (now_us() - start_us_) * 1e-6; }

}  // namespace pwm::programs
