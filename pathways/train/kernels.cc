#include "pathways/train/kernels.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>

#include "collectives/bucketed_allreduce.h"
#include "collectives/communicator.h"
#include "common/check.h"
#include "common/time.h"
#include "common/trace.h"
#include "model/checkpoint.h"
#include "model/full_state.h"
#include "model/optim.h"
#include "model/params.h"
#include "model/train_step.h"
#include "model/transformer.h"
#include "pathways/kernel.h"

namespace pwm::pathways::train {

using collectives::Algorithm;
using collectives::Communicator;
using collectives::ReduceOp;
using model::ParamLayout;

namespace {

// Contexts of the in-kernel sub-communicators (docs/pathways.md reserves 900..999 for code
// around the runtime): the tp and dp groups inside a training slice.
constexpr uint32_t kTpContext = 901, kDpContext = 902;

// Per-worker state shared by the kernels: the workload, the dataset, and caches that are not
// values of any program (workspace, gradient scratch, sub-communicators).
struct Worker {
  model::TrainConfig cfg;
  PipelineShape pipe;
  std::shared_ptr<collectives::Transport> transport;
  std::shared_ptr<const model::TextDataset> data;
  std::map<int, std::unique_ptr<ParamLayout>> layouts;  // by tp size * 64 + tp rank
  std::unique_ptr<model::Workspace<float>> ws;
  std::vector<float> grads;
  std::vector<int32_t> tokens;
  std::map<std::pair<uint32_t, std::vector<int>>, std::unique_ptr<Communicator>> comms;
  double busy_s = 0;                       // kernel time since the last step's stats
  double comm_s = 0;                       // collective time in this step's earlier kernels
  std::unique_ptr<Trace> trace;            // this worker's kernel spans (absolute timestamps)

  const ParamLayout& layout(int tp, int tp_rank) {
    auto& l = layouts[tp * 64 + tp_rank];
    if (!l) l = std::make_unique<ParamLayout>(cfg.model, tp_rank, tp);
    return *l;
  }
  model::Workspace<float>& workspace(const ParamLayout& layout) {
    if (!ws) ws = std::make_unique<model::Workspace<float>>(layout, cfg.micro_batch());
    return *ws;
  }
  Communicator& comm(uint32_t context, std::vector<int> group) {
    auto& c = comms[{context, group}];
    if (!c) {
      collectives::CommOptions o = collectives::CommOptions::from_env();
      o.timeout_s = cfg.coll_timeout;
      c = std::make_unique<Communicator>(transport, group, context, o);
    }
    return *c;
  }
};

Worker* g = nullptr;

// The mesh position of this shard in a dp x tp training slice (a pipeline stage: 1 x 1).
struct Pos {
  int dp, tp, dp_rank, tp_rank;
};
Pos pos_of(const KernelContext& ctx, int tp) {
  const int n = ctx.num_shards();
  return {n / tp, tp, ctx.shard() / tp, ctx.shard() % tp};
}

// Sub-groups of the slice communicator.
Communicator* tp_comm(KernelContext& ctx, const Pos& p) {
  if (p.tp == 1) return nullptr;
  std::vector<int> grp;
  for (int t = 0; t < p.tp; ++t) grp.push_back(ctx.comm().group()[p.dp_rank * p.tp + t]);
  return &g->comm(kTpContext, grp);
}
Communicator* dp_comm(KernelContext& ctx, const Pos& p) {
  if (p.dp == 1) return nullptr;
  std::vector<int> grp;
  for (int d = 0; d < p.dp; ++d) grp.push_back(ctx.comm().group()[d * p.tp + p.tp_rank]);
  return &g->comm(kDpContext, grp);
}

model::TpReduce<float> tp_reducer(Communicator* c, double* comm_s) {
  if (!c) return {};
  return [c, comm_s](float* d, size_t n) {
    const double t0 = now_s();
    c->allreduce(d, d, n, collectives::DataType::kFloat32, ReduceOp::kSum);
    *comm_s += now_s() - t0;
  };
}

ArgSpec split_f32(int64_t n) { return {TensorSpec{DataType::kFloat32, {n}}, Sharding::kSplit}; }
ArgSpec split_f64(int64_t n) { return {TensorSpec{DataType::kFloat64, {n}}, Sharding::kSplit}; }
ArgSpec split_i32(int64_t n) { return {TensorSpec{DataType::kInt32, {n}}, Sharding::kSplit}; }
ArgSpec rep_i64(int64_t n) { return {TensorSpec{DataType::kInt64, {n}}, Sharding::kReplicated}; }

// Sizes that depend only on the config and the tp degree (attrs[0] = tp in every kernel).
int64_t total(int tp) { return g->layout(tp, 0).total(); }
int64_t act_n() { return g->cfg.micro_batch() * g->cfg.model.seq_len * g->cfg.model.d_model; }  // [N, C]
int64_t tokens_n() { return g->cfg.micro_batch() * (g->cfg.model.seq_len + 1); }

// The worker's step memory (workspace, gradient and token scratch), made once and sized for the
// layout. The state kernels call it first, as spmd_train's constructor makes its own: made in
// the first step instead, the 200 MB workspace's page faults took ~1 s of a chained run's first
// step. Later calls only return it.
model::Workspace<float>& step_memory(const ParamLayout& layout) {
  g->grads.resize(static_cast<size_t>(layout.total()));
  g->tokens.resize(static_cast<size_t>(tokens_n()));
  return g->workspace(layout);
}
int64_t head_grads_n() { return g->cfg.model.vocab * g->cfg.model.d_model + g->cfg.model.d_model; }  // embed | final_norm
int64_t layer_n(int tp, int l) {
  const auto& L = g->layout(tp, 0).layer(l);
  return L.end - L.begin;
}

Signature sig(std::vector<ArgSpec> in, std::vector<ArgSpec> out) {
  Signature s;
  s.inputs = std::move(in);
  s.outputs = std::move(out);
  return s;
}

// Every kernel is timed: its span goes to the worker's trace and, for the kernels of a training
// step, its time to busy_s (which the step's last kernel reports: step time and the pipeline
// bubble). Evaluation, checkpoints, hashing and set-up run between steps and are not counted.
bool counts_as_step_work(const std::string& name) {
  for (const char* k : {"pw_init", "pw_load", "pw_eval", "pw_hash", "pw_save", "pw_merge"})
    if (name == k) return false;
  return true;
}

void add(const std::string& name, bool collectives, SignatureFn sigfn, KernelFn fn) {
  const bool step_work = counts_as_step_work(name);
  KernelFn timed = [name, fn, step_work](KernelContext& ctx) {
    const int64_t t0 = now_us();
    fn(ctx);
    const int64_t t1 = now_us();
    if (step_work) g->busy_s += (t1 - t0) * 1e-6;
    if (g->trace) g->trace->span(name.substr(3), "kernel", t0, t1);
  };
  KernelRegistry::global().add(KernelDef{name, collectives, std::move(sigfn), std::move(timed)});
}

// The state buffers of a device: params, m, v, step.
std::vector<ArgSpec> state_specs(int tp) { return {split_f32(total(tp)), split_f32(total(tp)), split_f32(total(tp)), rep_i64(1)}; }

// ---- Whole-step kernels (fused) ---------------------------------------------------------------

void init_state(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  step_memory(layout);
  model::init_params(layout, g->cfg.model.seed, ctx.out<float>(0).data());
  std::fill(ctx.out<float>(1).begin(), ctx.out<float>(1).end(), 0.0f);
  std::fill(ctx.out<float>(2).begin(), ctx.out<float>(2).end(), 0.0f);
  ctx.out<int64_t>(3)[0] = 0;
}

void load_state(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  step_memory(layout);
  auto ck = model::load_resume_checkpoint(g->cfg);
  PWM_CHECK(ck.has_value(), "no checkpoint to resume from at {}", g->cfg.ckpt);
  model::scatter_full(layout, ck->params, ctx.out<float>(0).data());
  model::scatter_full(layout, ck->adam_m, ctx.out<float>(1).data());
  model::scatter_full(layout, ck->adam_v, ctx.out<float>(2).data());
  ctx.out<int64_t>(3)[0] = ck->step;
}

// The global squared norm, loss mean over dp, AdamW out of place: exactly spmd_train's tail.
model::UpdateResult finish_step(KernelContext& ctx, const Pos& p, const ParamLayout& layout, int64_t step,
                                double local_loss, const float* grads, double* comm_s, double* loss_out) {
  double red[2] = {local_loss, model::grad_sq_norm_tp(layout, grads)};
  const double t0 = now_s();
  if (Communicator* c = tp_comm(ctx, p))
    c->allreduce(&red[1], &red[1], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  if (Communicator* c = dp_comm(ctx, p))
    c->allreduce(&red[0], &red[0], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  *comm_s += now_s() - t0;
  *loss_out = red[0] / p.dp;
  const auto in = [&](size_t i) { return ctx.in<float>(i).data(); };
  return model::apply_update_into(g->cfg, layout, step, red[1], in(0), grads, in(1), in(2), ctx.out<float>(0).data(),
                                  ctx.out<float>(1).data(), ctx.out<float>(2).data());
}

void write_stats(KernelContext& ctx, size_t out, double loss, const model::UpdateResult& u, double t_start,
                 double comm_s) {
  auto s = ctx.out<double>(out);
  const double kernel_s = now_s() - t_start;
  s[kLoss] = loss;
  s[kGradNorm] = u.grad_norm;
  s[kLr] = u.lr;
  // The step's communication: this kernel's, and the collectives of its earlier kernels
  // (chained and opbyop reduce gradients in kernels of their own).
  s[kComputeMs] = (kernel_s - comm_s) * 1e3;
  s[kCommMs] = (comm_s + g->comm_s) * 1e3;
  g->comm_s = 0;
  s[kKernelMs] = kernel_s * 1e3;
  s[kBusyMs] = g->busy_s * 1e3 + kernel_s * 1e3;  // this kernel is not counted in busy_s yet
  g->busy_s = -kernel_s;                           // ...and will be when it returns
  s[kEndUs] = static_cast<double>(now_us());
}

void fused_step(KernelContext& ctx) {
  const double t_start = now_s();
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  const int64_t step = ctx.in<int64_t>(3)[0];
  double comm_s = 0;
  model::Workspace<float>& ws = step_memory(layout);
  const model::StepPlan plan(layout, g->cfg.microbatches);
  collectives::BucketedAllreduce reducer(dp_comm(ctx, p), plan.finish_order(), g->cfg.bucket_bytes,
                                         g->cfg.overlap);
  reducer.begin(g->grads.data());
  model::StepHooks hooks;
  hooks.tp_reduce = tp_reducer(tp_comm(ctx, p), &comm_s);
  hooks.unit_done = [&reducer](int u) { reducer.unit_done(u); };
  const double local = model::accumulate_gradients(g->cfg, layout, plan, *g->data, step, p.dp_rank, ctx.in<float>(0).data(),
                                                   g->grads.data(), ws, g->tokens.data(), hooks);
  reducer.finish();
  comm_s += reducer.comm_seconds();
  double loss = 0;
  const model::UpdateResult u = finish_step(ctx, p, layout, step, local, g->grads.data(), &comm_s, &loss);
  ctx.out<int64_t>(3)[0] = step + 1;
  write_stats(ctx, 4, loss, u, t_start, comm_s);
}

void evaluate(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  double comm_s = 0;
  model::Workspace<float>& ws = step_memory(layout);  // before g->tokens.data() is taken
  double sum = model::validation_loss_sum(g->cfg, layout, *g->data, p.dp_rank, ctx.in<float>(0).data(),
                                          ws, g->tokens.data(), tp_reducer(tp_comm(ctx, p), &comm_s));
  if (Communicator* c = dp_comm(ctx, p))
    c->allreduce(&sum, &sum, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  ctx.out<double>(0)[0] = sum / static_cast<double>(model::validation_batches(g->cfg, *g->data) * g->cfg.global_batch);
}

// Full tensors of this tp group (every dp replica computes the same).
std::vector<model::TensorData> full(KernelContext& ctx, const Pos& p, const ParamLayout& layout, const float* buf) {
  Communicator* c = tp_comm(ctx, p);
  return model::gather_full(layout, buf, [c](const float* shard, float* out, size_t n) {
    c->allgather(shard, out, n, collectives::DataType::kFloat32);
  });
}

// Full state of a pipeline from its stages' buffers: stage s's layers from input s, the
// embedding and the final norm (identical on every stage) from input 0.
void merge(KernelContext& ctx) {
  const ParamLayout& layout = g->layout(1, 0);
  const int L = static_cast<int>(g->cfg.model.n_layers);
  float* out = ctx.out<float>(0).data();
  std::memcpy(out, ctx.in<float>(0).data(), sizeof(float) * layout.total());
  for (int s = 1; s < g->pipe.stages; ++s) {
    const int l0 = g->pipe.layer_begin(s, L), l1 = g->pipe.layer_begin(s + 1, L);
    if (l1 <= l0) continue;
    const int64_t lo = layout.layer(l0).begin, hi = layout.layer(l1 - 1).end;
    std::memcpy(out + lo, ctx.in<float>(static_cast<size_t>(s)).data() + lo, sizeof(float) * (hi - lo));
  }
}

void zeros(KernelContext& ctx) {
  auto o = ctx.out<float>(0);
  std::fill(o.begin(), o.end(), 0.0f);
}

// This worker's trace fragment, as int64 words: [length in bytes, bytes...] (capacity attrs[1]).
void trace_dump(KernelContext& ctx) {
  auto o = ctx.out<int64_t>(0);
  std::string f = g->trace ? g->trace->fragment() : "";
  const size_t cap = (o.size() - 1) * sizeof(int64_t);
  if (f.size() > cap) f = f.substr(0, f.rfind("},", cap - 2) + 1);  // whole events only
  o[0] = static_cast<int64_t>(f.size());
  std::memcpy(o.data() + 1, f.data(), f.size());
}

void weights_hash(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  const uint64_t h = model::weights_hash(full(ctx, p, layout, ctx.in<float>(0).data()));
  std::memcpy(ctx.out<int64_t>(0).data(), &h, sizeof(h));
}

void save_state(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  model::Checkpoint ck;
  ck.config = g->cfg.model;
  ck.step = ctx.in<int64_t>(3)[0];
  ck.train_config_json = g->cfg.workload_json();
  ck.params = full(ctx, p, layout, ctx.in<float>(0).data());
  ck.adam_m = full(ctx, p, layout, ctx.in<float>(1).data());
  ck.adam_v = full(ctx, p, layout, ctx.in<float>(2).data());
  if (ctx.shard() == 0) model::save_checkpoint(g->cfg.ckpt, ck);
  ctx.out<int64_t>(0)[0] = ck.step;
}

// ---- Per-layer kernels (chained, and the pipeline's stages) ----------------------------------

// The shared workspace's activations, bound to a node's buffers for the duration of the node:
// Unbind restores the owned memory when the node ends (the buffers may be freed afterwards).
model::Activations<float>& act() { return g->ws->act; }
struct Unbind {
  ~Unbind() { g->ws->act.unbind_all(); }
};

void batch(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const int64_t micro = ctx.attr(1);
  const model::RowRange rows = model::batch_rows(g->cfg.global_batch, p.dp_rank, p.dp, micro, g->cfg.microbatches);
  g->data->train_batch(g->cfg.data_seed, ctx.in<int64_t>(0)[0], g->cfg.global_batch, g->cfg.model.seq_len, rows.begin,
                       rows.end, ctx.out<int32_t>(0).data());
}

void embed_fwd(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  g->workspace(layout);
  Unbind unbind;
  act().bind_x(0, ctx.out<float>(0).data());
  model::embed_forward<float>(layout, ctx.in<float>(0).data(), ctx.in<int32_t>(1).data(), act());
}

void block_fwd(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const int l = static_cast<int>(ctx.attr(1));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  auto& ws = g->workspace(layout);
  Unbind unbind;
  double comm_s = 0;
  act().bind_x(l, const_cast<float*>(ctx.in<float>(1).data()));  // read only: block_forward reads x(l)
  act().bind_x(l + 1, ctx.out<float>(0).data());
  act().bind_layer(l, ctx.out<float>(1).data());
  model::block_forward<float>(layout, ctx.in<float>(0).data(), l, act(), ws.scratch,
                              tp_reducer(tp_comm(ctx, p), &comm_s));
  g->comm_s += comm_s;
}

// inputs: params, x(L), tokens [, gE_prev]; outputs: loss f64[1], dx(L), gE (embed | final_norm)
void head(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  auto& ws = g->workspace(layout);
  Unbind unbind;
  const int L = static_cast<int>(g->cfg.model.n_layers);
  const float grad_scale = 1.0f / static_cast<float>(g->cfg.microbatches * p.dp);
  act().bind_x(L, const_cast<float*>(ctx.in<float>(1).data()));
  act().bind_dx(ctx.out<float>(1).data());
  const int32_t* tokens = ctx.in<int32_t>(2).data();
  ctx.out<double>(0)[0] = model::head_forward<float>(layout, ctx.in<float>(0).data(), tokens, act());
  // head_backward accumulates into the embed and final_norm regions of a full-size gradient
  // buffer: stage them there (zero or the previous micro-batch's sums), then copy them out.
  const int64_t VC = g->cfg.model.vocab * g->cfg.model.d_model, C = g->cfg.model.d_model;
  step_memory(layout);
  float* gE = g->grads.data();
  float* gF = gE + layout.final_norm_offset();
  if (ctx.num_inputs() > 3) {
    std::memcpy(gE, ctx.in<float>(3).data(), sizeof(float) * VC);
    std::memcpy(gF, ctx.in<float>(3).data() + VC, sizeof(float) * C);
  } else {
    std::fill(gE, gE + VC, 0.0f);
    std::fill(gF, gF + C, 0.0f);
  }
  model::head_backward<float>(layout, ctx.in<float>(0).data(), g->grads.data(), tokens, grad_scale, act(), ws.scratch);
  std::memcpy(ctx.out<float>(2).data(), gE, sizeof(float) * VC);
  std::memcpy(ctx.out<float>(2).data() + VC, gF, sizeof(float) * C);
}

// inputs: params, saved(l), x(l), dx(l+1) [, g_l prev]; outputs: dx(l), g_l
void block_bwd(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const int l = static_cast<int>(ctx.attr(1));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  auto& ws = g->workspace(layout);
  Unbind unbind;
  double comm_s = 0;
  act().bind_layer(l, const_cast<float*>(ctx.in<float>(1).data()));
  act().bind_x(l, const_cast<float*>(ctx.in<float>(2).data()));
  float* dx = ctx.out<float>(0).data();
  std::memcpy(dx, ctx.in<float>(3).data(), sizeof(float) * act_n());  // turned into d/dx(l) in place
  act().bind_dx(dx);
  float* gl = ctx.out<float>(1).data();
  const auto& range = layout.layer(l);
  if (ctx.num_inputs() > 4)
    std::memcpy(gl, ctx.in<float>(4).data(), sizeof(float) * (range.end - range.begin));
  else
    std::fill(gl, gl + (range.end - range.begin), 0.0f);
  model::block_backward<float>(layout, ctx.in<float>(0).data(), gl - range.begin, l, act(), ws.scratch,
                               tp_reducer(tp_comm(ctx, p), &comm_s));
  g->comm_s += comm_s;
}

// inputs: tokens, dx(0), gE; output: gE + the lookup's part of the embedding gradient
void embed_bwd(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  g->workspace(layout);
  Unbind unbind;
  act().bind_dx(const_cast<float*>(ctx.in<float>(1).data()));
  float* out = ctx.out<float>(0).data();
  std::memcpy(out, ctx.in<float>(2).data(), sizeof(float) * head_grads_n());
  model::embed_backward<float>(layout, out - layout.embed_offset(), ctx.in<int32_t>(0).data(), act());
}

void add_arrays(KernelContext& ctx) {
  auto a = ctx.in<float>(0), b = ctx.in<float>(1);
  auto o = ctx.out<float>(0);
  for (size_t i = 0; i < o.size(); ++i) o[i] = a[i] + b[i];
}

void dp_allreduce(KernelContext& ctx) {
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  auto in = ctx.in<float>(0);
  auto out = ctx.out<float>(0);
  if (Communicator* c = dp_comm(ctx, p)) {
    const double t0 = now_s();
    c->allreduce(in.data(), out.data(), in.size(), collectives::DataType::kFloat32, ReduceOp::kSum);
    g->comm_s += now_s() - t0;
  } else
    std::memcpy(out.data(), in.data(), sizeof(float) * in.size());
}

// Assembles the gradient pieces into the layout's one buffer, in the layout's place for each.
// inputs from `first`: gE (embed | final_norm), then g_l for l in [l0, l1).
void assemble_grads(KernelContext& ctx, const ParamLayout& layout, size_t first, int l0, int l1) {
  g->grads.assign(static_cast<size_t>(layout.total()), 0.0f);
  const int64_t VC = g->cfg.model.vocab * g->cfg.model.d_model, C = g->cfg.model.d_model;
  const float* gE = ctx.in<float>(first).data();
  std::memcpy(g->grads.data() + layout.embed_offset(), gE, sizeof(float) * VC);
  std::memcpy(g->grads.data() + layout.final_norm_offset(), gE + VC, sizeof(float) * C);
  for (int l = l0; l < l1; ++l) {
    const auto& r = layout.layer(l);
    std::memcpy(g->grads.data() + r.begin, ctx.in<float>(first + 1 + (l - l0)).data(), sizeof(float) * (r.end - r.begin));
  }
}

// inputs: params, m, v, step, gE, g_0..g_{L-1}, loss_0..loss_{M-1}; outputs: params, m, v, step, stats
void update(KernelContext& ctx) {
  const double t_start = now_s();
  const Pos p = pos_of(ctx, static_cast<int>(ctx.attr(0)));
  const ParamLayout& layout = g->layout(p.tp, p.tp_rank);
  const int L = static_cast<int>(g->cfg.model.n_layers);
  const int64_t step = ctx.in<int64_t>(3)[0];
  assemble_grads(ctx, layout, 4, 0, L);
  double local = 0;
  for (int64_t m = 0; m < g->cfg.microbatches; ++m) local += ctx.in<double>(5 + L + m)[0];
  local /= static_cast<double>(g->cfg.microbatches);
  double comm_s = 0, loss = 0;
  const model::UpdateResult u = finish_step(ctx, p, layout, step, local, g->grads.data(), &comm_s, &loss);
  ctx.out<int64_t>(3)[0] = step + 1;
  write_stats(ctx, 4, loss, u, t_start, comm_s);
}

// ---- Pipeline-only kernels (one device per stage, tp = dp = 1) --------------------------------

// inputs: gE (embed | final_norm) [, g_l for the stage's layers]; output: this stage's share of
// the squared gradient norm (the embedding and final norm counted on stage 0 only).
void pipe_sqnorm(KernelContext& ctx) {
  const int stage = static_cast<int>(ctx.attr(1));
  double s = 0;
  for (size_t i = stage == 0 ? 0 : 1; i < ctx.num_inputs(); ++i) {
    auto a = ctx.in<float>(i);
    s += model::sq_norm(a.data(), a.size());
  }
  ctx.out<double>(0)[0] = s;
}

void sum_scalars(KernelContext& ctx) {
  double s = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) s += ctx.in<double>(i)[0];
  ctx.out<double>(0)[0] = s;
}

// inputs: params, m, v, step, total_sq f64[1], gE, g_l (stage layers) [, losses on the last stage]
// outputs: params, m, v, step, stats. Updates the stage's layers plus the embedding and the final
// norm (every stage holds them; they receive the same gradient, so they stay identical).
void pipe_update(KernelContext& ctx) {
  const double t_start = now_s();
  const int stage = static_cast<int>(ctx.attr(1));
  const ParamLayout& layout = g->layout(1, 0);
  const int L = static_cast<int>(g->cfg.model.n_layers);
  const int l0 = g->pipe.layer_begin(stage, L), l1 = g->pipe.layer_begin(stage + 1, L);
  const int64_t step = ctx.in<int64_t>(3)[0];
  const double total_sq = ctx.in<double>(4)[0];
  assemble_grads(ctx, layout, 5, l0, l1);
  const float* pin = ctx.in<float>(0).data();
  const float* min = ctx.in<float>(1).data();
  const float* vin = ctx.in<float>(2).data();
  float* pout = ctx.out<float>(0).data();
  float* mout = ctx.out<float>(1).data();
  float* vout = ctx.out<float>(2).data();
  std::memcpy(pout, pin, sizeof(float) * layout.total());  // layers of other stages pass through
  std::memcpy(mout, min, sizeof(float) * layout.total());
  std::memcpy(vout, vin, sizeof(float) * layout.total());
  const double lr = model::lr_at(g->cfg.optim, step), clip = model::clip_factor(g->cfg.optim, total_sq);
  auto upd = [&](int64_t lo, int64_t hi) {
    model::adamw_update(g->cfg.optim, layout, lo, hi, step, lr, clip, pout, g->grads.data(), mout, vout);
  };
  upd(layout.embed_offset(), layout.embed_offset() + g->cfg.model.vocab * g->cfg.model.d_model);
  if (l1 > l0) upd(layout.layer(l0).begin, layout.layer(l1 - 1).end);
  upd(layout.final_norm_offset(), layout.total());
  double loss = 0;
  const size_t first_loss = 6 + static_cast<size_t>(l1 - l0);
  for (size_t i = first_loss; i < ctx.num_inputs(); ++i) loss += ctx.in<double>(i)[0];
  if (ctx.num_inputs() > first_loss) loss /= static_cast<double>(ctx.num_inputs() - first_loss);
  ctx.out<int64_t>(3)[0] = step + 1;
  write_stats(ctx, 4, loss, model::UpdateResult{lr, std::sqrt(total_sq)}, t_start, 0.0);
}

}  // namespace

void register_train_kernels(const model::TrainConfig& cfg, PipelineShape pipe,
                            std::shared_ptr<collectives::Transport> transport,
                            std::shared_ptr<const model::TextDataset> data) {
  static std::once_flag once;
  std::call_once(once, [&] {
    g = new Worker{cfg, pipe, std::move(transport), std::move(data), {}, {}, {}, {}, {}, 0, 0, nullptr};
    if (!cfg.trace.empty() && g->transport->rank() != 0) {
      g->trace = std::make_unique<Trace>(true, g->transport->rank(), 0);
      g->trace->process_name(fmt::format("worker rank {} (device {})", g->transport->rank(), g->transport->rank() - 1));
    }
    auto tp_of = [](std::span<const int64_t> a) { return static_cast<int>(a[0]); };
    // attrs[0] = tp everywhere; [1] = layer, micro index or stage where noted.
    add("pw_init", false, [=](auto a, int) { return sig({}, state_specs(tp_of(a))); }, init_state);
    add("pw_load", false, [=](auto a, int) { return sig({}, state_specs(tp_of(a))); }, load_state);
    add("pw_fused_step", true, [=](auto a, int) {
      auto in = state_specs(tp_of(a));
      auto out = in;
      out.push_back(split_f64(kStats));
      return sig(in, out);
    }, fused_step);
    add("pw_eval", true, [=](auto a, int) { return sig({split_f32(total(tp_of(a)))}, {split_f64(1)}); }, evaluate);
    add("pw_hash", true, [=](auto a, int) {
      return sig({split_f32(total(tp_of(a)))}, {ArgSpec{TensorSpec{DataType::kInt64, {1}}, Sharding::kSplit}});
    }, weights_hash);
    add("pw_merge", false, [=](auto, int) {
      return sig(std::vector<ArgSpec>(static_cast<size_t>(g->pipe.stages), split_f32(total(1))), {split_f32(total(1))});
    }, merge);
    add("pw_zeros", false, [=](auto a, int) { return sig({}, {split_f32(a[1])}); }, zeros);
    KernelRegistry::global().add(KernelDef{"pw_trace", false, [=](auto a, int) {
      return sig({}, {ArgSpec{TensorSpec{DataType::kInt64, {a[1]}}, Sharding::kSplit}});
    }, trace_dump});
    add("pw_save", true, [=](auto a, int) { return sig(state_specs(tp_of(a)), {rep_i64(1)}); }, save_state);

    add("pw_batch", false, [=](auto, int) { return sig({rep_i64(1)}, {split_i32(tokens_n())}); }, batch);
    add("pw_embed_fwd", false, [=](auto a, int) {
      return sig({split_f32(total(tp_of(a))), split_i32(tokens_n())}, {split_f32(act_n())});
    }, embed_fwd);
    auto saved_n = [](int tp) { return model::Activations<float>::layer_elements(g->layout(tp, 0), g->cfg.micro_batch()); };
    for (bool coll : {false, true}) {
      const std::string sfx = coll ? "_tp" : "";
      add("pw_block_fwd" + sfx, coll, [=](auto a, int) {
        return sig({split_f32(total(tp_of(a))), split_f32(act_n())}, {split_f32(act_n()), split_f32(saved_n(tp_of(a)))});
      }, block_fwd);
      for (bool acc : {false, true})
        add("pw_block_bwd" + sfx + (acc ? "_acc" : ""), coll, [=](auto a, int) {
          const int tp = tp_of(a);
          std::vector<ArgSpec> in = {split_f32(total(tp)), split_f32(saved_n(tp)), split_f32(act_n()), split_f32(act_n())};
          if (acc) in.push_back(split_f32(layer_n(tp, static_cast<int>(a[1]))));
          return sig(in, {split_f32(act_n()), split_f32(layer_n(tp, static_cast<int>(a[1])))});
        }, block_bwd);
    }
    for (bool acc : {false, true})
      add(acc ? "pw_head_acc" : "pw_head", false, [=](auto a, int) {
        std::vector<ArgSpec> in = {split_f32(total(tp_of(a))), split_f32(act_n()), split_i32(tokens_n())};
        if (acc) in.push_back(split_f32(head_grads_n()));
        return sig(in, {split_f64(1), split_f32(act_n()), split_f32(head_grads_n())});
      }, head);
    add("pw_embed_bwd", false, [=](auto, int) {
      return sig({split_i32(tokens_n()), split_f32(act_n()), split_f32(head_grads_n())}, {split_f32(head_grads_n())});
    }, embed_bwd);
    add("pw_add", false, [=](auto a, int) { return sig({split_f32(a[1]), split_f32(a[1])}, {split_f32(a[1])}); }, add_arrays);
    add("pw_dp_allreduce", true, [=](auto a, int) { return sig({split_f32(a[1])}, {split_f32(a[1])}); }, dp_allreduce);
    add("pw_update", true, [=](auto a, int) {
      const int tp = tp_of(a);
      auto in = state_specs(tp);
      in.push_back(split_f32(head_grads_n()));
      for (int l = 0; l < g->cfg.model.n_layers; ++l) in.push_back(split_f32(layer_n(tp, l)));
      for (int64_t m = 0; m < g->cfg.microbatches; ++m) in.push_back(split_f64(1));
      auto out = state_specs(tp);
      out.push_back(split_f64(kStats));
      return sig(in, out);
    }, update);

    add("pw_pipe_sqnorm", false, [=](auto a, int) {
      const int stage = static_cast<int>(a[1]), L = static_cast<int>(g->cfg.model.n_layers);
      std::vector<ArgSpec> in = {split_f32(head_grads_n())};
      for (int l = g->pipe.layer_begin(stage, L); l < g->pipe.layer_begin(stage + 1, L); ++l) in.push_back(split_f32(layer_n(1, l)));
      return sig(in, {split_f64(1)});
    }, pipe_sqnorm);
    add("pw_sum", false, [=](auto a, int) {
      return sig(std::vector<ArgSpec>(static_cast<size_t>(a[1]), split_f64(1)), {split_f64(1)});
    }, sum_scalars);
    add("pw_pipe_update", false, [=](auto a, int) {
      const int stage = static_cast<int>(a[1]), L = static_cast<int>(g->cfg.model.n_layers);
      auto in = state_specs(1);
      in.push_back(split_f64(1));
      in.push_back(split_f32(head_grads_n()));
      for (int l = g->pipe.layer_begin(stage, L); l < g->pipe.layer_begin(stage + 1, L); ++l) in.push_back(split_f32(layer_n(1, l)));
      if (stage == g->pipe.stages - 1)
        for (int64_t m = 0; m < g->cfg.microbatches; ++m) in.push_back(split_f64(1));
      auto out = state_specs(1);
      out.push_back(split_f64(kStats));
      return sig(in, out);
    }, pipe_update);
  });
}

}  // namespace pwm::pathways::train
