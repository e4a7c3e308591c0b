#include "programs/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "common/check.h"

namespace pwm::programs {

using model::StepPlan;
using model::Unit;
using model::UnitKind;
using pwm::train::Schedule;

namespace {

// One pipeline's step up to its gradients: stage s on slices[s] with state st[s], the units of
// every micro-batch in the schedule's order, each layer's piece reduced over its stage's dp group.
struct PipelineGrads {
  std::vector<std::vector<dataflow::Value>> layers;  // per stage: its layers' pieces, in layer order
  dataflow::Value tied, loss;                        // the tied piece (on stage 0), the loss (on the last stage)
};

// A forward (fwd) or a backward of micro-batch m on a stage.
struct PipeOp {
  bool fwd;
  int64_t m;
};

// Each stage's order of forwards and backwards under `schedule` (S stages, M micro-batches).
std::vector<std::vector<PipeOp>> stage_orders(Schedule schedule, int S, int64_t M) {
  std::vector<std::vector<PipeOp>> order(S);
  for (int s = 0; s < S; ++s) {
    if (schedule == Schedule::kGpipe) {
      for (int64_t m = 0; m < M; ++m) order[s].push_back({true, m});
      for (int64_t m = 0; m < M; ++m) order[s].push_back({false, m});
    } else {  // 1F1B: S-1-s warm-up forwards, then one forward and one backward in turn
      const int64_t warm = std::min<int64_t>(S - 1 - s, M);
      for (int64_t m = 0; m < warm; ++m) order[s].push_back({true, m});
      for (int64_t i = 0; i < M; ++i) {
        if (warm + i < M) order[s].push_back({true, warm + i});
        order[s].push_back({false, i});
      }
    }
  }
  return order;
}

// Traces one pipeline's nodes into `b`: the values in flight between the forward and backward
// units of every stage and micro-batch, as members.
class PipelineTracer {
 public:
  PipelineTracer(const SliceCall& call, int first_slice, const Shapes& sh, const KernelNames& names,
                 std::span<const State<dataflow::Value>> st, int replica)
      : call_(call), first_(first_slice), sh_(sh), names_(names), st_(st), replica_(replica),
        S_(static_cast<int>(st.size())), tp_(sh.cfg().mesh.tp), reduce_(sh.cfg().mesh.dp > 1),
        overlap_(sh.cfg().exec.overlap), plan_(sh.plan(tp_)), M_(plan_.microbatches()), loss_(M_), dhead_(M_),
        tok0_(M_), xout_(S_, std::vector<dataflow::Value>(M_)), dxout_(xout_),
        xs_(S_, std::vector<std::vector<dataflow::Value>>(M_)), saved_(xs_), gl_(static_cast<size_t>(plan_.layers())),
        started_(S_) {}

  PipelineGrads trace(Schedule schedule) {
    run_in_order(stage_orders(schedule, S_, M_));
    return finish();
  }

 private:
  struct Started {  // a dp reduction started after a layer's last backward
    int layer;
    dataflow::Value piece, sum;
  };

  std::vector<dataflow::Value> call(int s, const std::string& k, std::vector<dataflow::Value> in, std::vector<int64_t> attrs) {
    return call_(first_ + s, k, std::move(in), std::move(attrs));
  }
  // Replicas: replica r's batch nodes read its rows (ReplicaAttrs::kBatchReplica).
  std::vector<int64_t> batch_attrs(int64_t m) const {
    return replica_ >= 0 ? std::vector<int64_t>{tp_, m, replica_} : std::vector<int64_t>{tp_, m};
  }
  void forward(int s, int64_t m);
  void backward(int s, int64_t m);
  void block_backward(int s, int64_t m, const Unit& u, const StageLayers& sl, dataflow::Value& dx);
  void run_in_order(const std::vector<std::vector<PipeOp>>& order);
  PipelineGrads finish();

  const SliceCall& call_;
  const int first_;  // the pipeline's stage 0 slice
  const Shapes& sh_;
  const KernelNames& names_;
  std::span<const State<dataflow::Value>> st_;
  const int replica_, S_, tp_;
  const bool reduce_;   // the stage's gradient pieces are summed over its dp group
  const bool overlap_;  // ... started as soon as final (dp_reduce_start), else blocking
  const StepPlan& plan_;
  const int64_t M_;
  std::vector<dataflow::Value> loss_, dhead_, tok0_;
  std::vector<std::vector<dataflow::Value>> xout_, dxout_;
  std::vector<std::vector<std::vector<dataflow::Value>>> xs_, saved_;
  std::vector<dataflow::Value> gl_;  // per layer: the running sum over micro-batches
  dataflow::Value gEh_, gL_;         // the tied piece's head part (last stage) and lookup part (stage 0)
  std::vector<std::vector<Started>> started_;  // per stage, the dp reductions in start order
};

void PipelineTracer::forward(int s, int64_t m) {
  const StageLayers sl = stage_layers(sh_, s);
  dataflow::Value x = s == 0 ? dataflow::Value{} : xout_[s - 1][m], tokens;
  for (const Unit& u : plan_.forward_units(m, sl.begin, sl.end)) {
    const std::string k = names_.unit(u, tp_);
    switch (u.kind) {
      case UnitKind::kBatch:
        tokens = call(s, k, {st_[s].step}, batch_attrs(m))[0];
        if (s == 0) tok0_[m] = tokens;
        break;
      case UnitKind::kEmbedForward: x = call(s, k, {st_[s].params, tokens}, {tp_})[0]; break;
      case UnitKind::kBlockForward: {
        xs_[s][m].push_back(x);
        auto r = call(s, k, {st_[s].params, x}, {tp_, u.layer});
        x = r[0];
        saved_[s][m].push_back(r[1]);
        break;
      }
      case UnitKind::kHead: {
        std::vector<dataflow::Value> in(m > 0 ? kHeadTiedPrev + 1 : kHeadTiedPrev);
        in[kHeadParams] = st_[s].params;
        in[kHeadX] = x;
        in[kHeadTokens] = tokens;
        if (m > 0) in[kHeadTiedPrev] = gEh_;
        auto h = call(s, k, in, {tp_});
        loss_[m] = h[kHeadLoss];
        dhead_[m] = h[kHeadDx];  // the gradient entering the last stage's backward
        gEh_ = h[kHeadTied];
        break;
      }
      default: PWM_THROW("{} is not a forward unit", model::unit_kind_name(u.kind));
    }
  }
  xout_[s][m] = x;
}

void PipelineTracer::backward(int s, int64_t m) {
  const StageLayers sl = stage_layers(sh_, s);
  dataflow::Value dx = s == S_ - 1 ? dhead_[m] : dxout_[s + 1][m];
  for (const Unit& u : plan_.backward_units(m, sl.begin, sl.end)) {
    if (u.kind == UnitKind::kBlockBackward) {
      block_backward(s, m, u, sl, dx);
      continue;
    }
    // embed_bwd, on stage 0
    std::vector<dataflow::Value> in(kEBwdTied + 1);
    in[kEBwdTokens] = tok0_[m];
    in[kEBwdDx] = dx;
    in[kEBwdTied] = m > 0 ? gL_ : call(0, names_("zeros"), {}, {tp_, sh_.piece(tp_, StepPlan::kTiedPiece)})[0];
    gL_ = call(0, names_.unit(u, tp_), in, {tp_})[0];
  }
  dxout_[s][m] = dx;  // what stage s-1's backward starts from
}

void PipelineTracer::block_backward(int s, int64_t m, const Unit& u, const StageLayers& sl, dataflow::Value& dx) {
  const size_t i = static_cast<size_t>(u.layer - sl.begin);
  std::vector<dataflow::Value> in(m > 0 ? kBwdGradPrev + 1 : kBwdGradPrev);
  in[kBwdParams] = st_[s].params;
  in[kBwdSaved] = saved_[s][m][i];
  in[kBwdX] = xs_[s][m][i];
  in[kBwdDx] = dx;
  if (m > 0) in[kBwdGradPrev] = gl_[u.layer];
  auto r = call(s, names_.unit(u, tp_), in, {tp_, u.layer});
  dx = r[kBwdDxOut];
  gl_[u.layer] = r[kBwdGrad];
  // The layer's gradient is final after the last micro-batch: its dp sum inside the stage's
  // slice starts right after (overlap: dp_reduce_start, finished after the stage's backward,
  // so the sum advances while the stage computes the backward of its earlier layers;
  // --no-overlap: the blocking dp_allreduce, the next backward unit waiting for it).
  if (!reduce_ || m != M_ - 1) return;
  const int64_t n = sh_.piece(tp_, StepPlan::layer_piece(u.layer));
  if (overlap_) {
    started_[s].push_back({u.layer, gl_[u.layer], call(s, names_("dp_reduce_start"), {gl_[u.layer]}, {tp_, n, u.layer})[0]});
  } else {
    gl_[u.layer] = call(s, names_("dp_allreduce"), {gl_[u.layer]}, {tp_, n})[0];
  }
}

// One global order that respects the dependencies: one op per stage per round, so that a
// consumer follows its producer closely in program order (the producer's worker then sends as
// soon as the value exists). The workers run their nodes in this order (RunOptions::in_order):
// it is the schedule.
void PipelineTracer::run_in_order(const std::vector<std::vector<PipeOp>>& order) {
  std::vector<size_t> next(S_, 0);
  std::vector<std::vector<char>> fdone(S_, std::vector<char>(M_, 0)), bdone = fdone;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S_; ++s) {
      if (next[s] >= order[s].size()) continue;
      const PipeOp op = order[s][next[s]];
      const bool ready = op.fwd ? (s == 0 || fdone[s - 1][op.m]) : (fdone[s][op.m] && (s == S_ - 1 || bdone[s + 1][op.m]));
      if (!ready) continue;
      if (op.fwd) {
        forward(s, op.m);
        fdone[s][op.m] = 1;
      } else {
        backward(s, op.m);
        bdone[s][op.m] = 1;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < S_; ++s) PWM_CHECK_EQ(next[s], order[s].size());
}

PipelineGrads PipelineTracer::finish() {
  // Each stage's dp sums are finished after its whole backward, in the order they started.
  for (int s = 0; s < S_; ++s)
    for (const Started& r : started_[s])
      gl_[r.layer] = call(s, names_("dp_reduce_finish"), {r.piece, r.sum},
                          {tp_, sh_.piece(tp_, StepPlan::layer_piece(r.layer)), r.layer})[0];
  // Tied embedding: the head's part (last stage) plus the lookup's part (stage 0), summed over
  // stage 0's dp group. The loss: the last stage's dp sum of its devices' micro-batch means.
  const int64_t tied_n = sh_.piece(tp_, StepPlan::kTiedPiece);
  PipelineGrads out;
  out.tied = call(0, names_("add"), {gEh_, gL_}, {tp_, tied_n})[0];
  if (reduce_) out.tied = call(0, names_("dp_allreduce"), {out.tied}, {tp_, tied_n})[0];
  out.loss = call(S_ - 1, names_("island_loss"), loss_, {tp_, M_})[0];
  for (int s = 0; s < S_; ++s) {
    const StageLayers sl = stage_layers(sh_, s);
    out.layers.emplace_back(gl_.begin() + sl.begin, gl_.begin() + sl.end);
  }
  return out;
}

PipelineGrads trace_pipeline(const SliceCall& call, int first_slice, const Shapes& sh, const KernelNames& names,
                             Schedule schedule, std::span<const State<dataflow::Value>> st, int replica) {
  return PipelineTracer(call, first_slice, sh, names, st, replica).trace(schedule);
}

}  // namespace

std::vector<int> stage_activations(Schedule schedule, int S, int64_t M) {
  std::vector<int> need;
  for (const std::vector<PipeOp>& ops : stage_orders(schedule, S, M)) {
    int live = 0, most = 0;
    for (const PipeOp& op : ops) most = std::max(most, live += op.fwd ? 1 : -1);
    need.push_back(most);
  }
  return need;
}

std::string pipeline_name(const Shapes& sh, Schedule schedule) {
  const int S = sh.pipe().stages, R = sh.cfg().mesh.replicas;
  const int64_t M = sh.plan(sh.cfg().mesh.tp).microbatches();
  return R > 1 ? fmt::format("pipeline-{}-R{}-S{}-M{}", pwm::train::name(schedule), R, S, M)
               : fmt::format("pipeline-{}-S{}-M{}", pwm::train::name(schedule), S, M);
}

std::vector<dataflow::Value> trace_pipeline_step(const Shapes& sh, const KernelNames& names, Schedule schedule,
                                                 const std::vector<State<dataflow::Value>>& all, const SliceCall& slice_call) {
  const int S = sh.pipe().stages;
  const int R = sh.cfg().mesh.replicas;  // > 1: R pipelines, one per replica, exchanging gradients
  PWM_CHECK(static_cast<int>(all.size()) == R * S, "trace_pipeline_step: {} slices' states for {} replicas of {} stages",
            all.size(), R, S);
  const int tp = sh.cfg().mesh.tp;           // every stage is a dp x tp slice (mesh {dp, tp})
  std::vector<dataflow::Value> out;
  std::vector<PipelineGrads> rep;
  for (int r = 0; r < R; ++r)
    rep.push_back(trace_pipeline(slice_call, r * S, sh, names, schedule,
                                 std::span<const State<dataflow::Value>>(all).subspan(static_cast<size_t>(r * S), S),
                                 R > 1 ? r : -1));
  // Replicas: on every replica's stage s, each of the stage's pieces summed over the replicas in
  // replica order (replica_add: the same inputs in the same order everywhere, so the same bits on
  // every replica; the transfers between the replicas' corresponding devices are posted as soon
  // as each piece exists), the tied piece on stage 0.
  auto sum_replicas = [&](int r, int s, int piece, auto pick) {
    if (R == 1) return pick(0);
    std::vector<dataflow::Value> in;
    for (int q = 0; q < R; ++q) in.push_back(pick(q));
    return slice_call(r * S + s, names("replica_add"), in, replica_add_attrs(tp, sh.piece(tp, piece), R, r))[0];
  };
  for (int r = 0; r < R; ++r) {
    auto call = [&](int s, const std::string& k, std::vector<dataflow::Value> in, std::vector<int64_t> attrs) {
      return slice_call(r * S + s, k, std::move(in), std::move(attrs));
    };
    // Every stage applies the same update to its copy of the tied embedding. The clipping norm
    // sums every stage's share (the replicas' summed pieces: the same on every replica).
    const dataflow::Value tied = sum_replicas(r, 0, StepPlan::kTiedPiece, [&](int q) { return rep[q].tied; });
    std::vector<std::vector<dataflow::Value>> pieces(S);
    std::vector<dataflow::Value> sq;
    for (int s = 0; s < S; ++s) {
      const StageLayers sl = stage_layers(sh, s);
      pieces[s].push_back(tied);
      for (int l = sl.begin; l < sl.end; ++l)
        pieces[s].push_back(sum_replicas(r, s, StepPlan::layer_piece(l),
                                         [&](int q) { return rep[q].layers[s][static_cast<size_t>(l - sl.begin)]; }));
      sq.push_back(call(s, names("pipe_sqnorm"), pieces[s], {tp, s})[0]);
    }
    const dataflow::Value total = call(0, names("sum"), sq, {tp, S})[0];
    // The last stage's update takes every replica's loss, in replica order.
    std::vector<dataflow::Value> losses;
    for (int q = 0; q < R; ++q) losses.push_back(rep[q].loss);
    for (int s = 0; s < S; ++s) {
      const std::vector<dataflow::Value> l = s == S - 1 ? losses : std::vector<dataflow::Value>{};
      const State<dataflow::Value>& state = all[static_cast<size_t>(r * S + s)];
      for (auto& v : call(s, names("pipe_update"), pipe_update_args(sh, s).pack<dataflow::Value>(state, &total, pieces[s], l), {tp, s}))
        out.push_back(v);
    }
  }
  return out;
}

}  // namespace pwm::programs
