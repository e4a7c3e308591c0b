#include "pathways/train/step_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <span>

#include "common/check.h"
#include "programs/trace_impl.h"

namespace pwm::programs {
// pathways' opbyop step: trace_step over Client::call, each node run at once.
template std::vector<pathways::Array> trace_step(const Shapes&, const KernelNames&, int, const State<pathways::Array>&,
                                                 const CallFn<pathways::Array>&, const RouteFn<pathways::Array>&,
                                                 int64_t*, const ExpertIsland<pathways::Array>*);
}  // namespace pwm::programs

namespace pwm::pathways::train {

using model::StepPlan;
using model::Unit;
using model::UnitKind;


// ---- The step cut at the controller's routing (--moe-routing controller, chained) -------------

namespace {

// A value while the segments are traced: made by segment `seg`'s builder (on `slice`, null for
// the step's slice), or the step's input `input` (seg < 0).
struct SegValue {
  int seg = -1;
  size_t input = 0;
  Value v;
  const Slice* slice = nullptr;
};

class Segmenter {
 public:
  Segmenter(const Shapes& sh, const Slice& slice, const std::vector<Array>& inputs)
      : sh_(sh), slice_(slice), inputs_(inputs) {
    open();
  }
  std::vector<SegValue> call(const std::string& k, const std::vector<SegValue>& in, std::vector<int64_t> at,
                             const Slice* on = nullptr) {
    std::vector<Value> vals;
    for (const SegValue& x : in) vals.push_back(here(x));
    std::vector<SegValue> out;
    for (const Value& v : builders_.back()->call(k, on ? *on : slice_, vals, std::move(at))) out.push_back({cur(), 0, v, on});
    return out;
  }
  // The counts end the segment (its output the controller fetches); the next segment starts
  // with the matrix the controller puts back as its parameter, on `on` (null: the step's slice).
  // Counts of the segment before the current one, which has no node yet, add a matrix to the
  // same cut (--expert-island: one per experts' device).
  SegValue cut(const SegValue& counts, const Slice* on, const ArgSpec& spec) {
    if (counts.seg == cur()) {
      out_.counts_output.emplace_back();
      open();
    } else {
      PWM_CHECK(counts.seg == cur() - 1 && nodes_ == 0, "the routing counts come from the segment being traced");
    }
    out_.counts_output[static_cast<size_t>(counts.seg)].push_back(output_of(counts));
    out_.inputs.back().push_back({SegmentedStep::kPut, out_.counts_output[static_cast<size_t>(counts.seg)].size() - 1});
    return {cur(), 0, builders_.back()->param(on ? *on : slice_, spec), on};
  }
  SegmentedStep finish(const std::vector<SegValue>& outputs) {
    for (const SegValue& o : outputs) out_.outputs.push_back({o.seg, o.seg < 0 ? o.input : output_of(o)});
    for (auto& b : builders_) out_.programs.push_back(b->build());
    return std::move(out_);
  }

 private:
  int cur() const { return static_cast<int>(builders_.size()) - 1; }
  void open() {
    builders_.push_back(std::make_unique<ProgramBuilder>(fmt::format("chained-step-{}", builders_.size())));
    out_.inputs.emplace_back();
    params_.emplace_back();
    nodes_ = 0;
  }
  // x as a value of the current segment: itself, or a parameter bound to where it comes from.
  Value here(const SegValue& x) {
    ++nodes_;  // (here() runs for a node's inputs: the segment is no longer empty)
    if (x.seg == cur()) return x.v;
    const std::tuple<int, size_t, ValueId> key{x.seg, x.seg < 0 ? x.input : 0, x.seg < 0 ? ValueId{} : x.v.id()};
    auto it = params_.back().find(key);
    if (it != params_.back().end()) return it->second;
    Value p = x.seg < 0 ? builders_.back()->param_like(inputs_[x.input])
                        : builders_.back()->param(x.slice ? *x.slice : slice_, x.v.spec());
    out_.inputs.back().push_back({x.seg, x.seg < 0 ? x.input : output_of(x)});
    params_.back().emplace(key, p);
    return p;
  }
  // x's position among its segment's outputs (made an output on first use).
  size_t output_of(const SegValue& x) {
    auto& outs = outputs_[x.seg];
    auto it = outs.find(x.v.id());
    if (it != outs.end()) return it->second;
    builders_[static_cast<size_t>(x.seg)]->output(x.v);
    const size_t i = outs.size();
    outs.emplace(x.v.id(), i);
    return i;
  }

  const Shapes& sh_;
  const Slice& slice_;
  const std::vector<Array>& inputs_;
  std::vector<std::unique_ptr<ProgramBuilder>> builders_;
  std::vector<std::map<std::tuple<int, size_t, ValueId>, Value>> params_;  // per segment
  std::map<int, std::map<ValueId, size_t>> outputs_;                       // per segment: value -> output index
  SegmentedStep out_;
  int nodes_ = 0;  // node inputs traced into the current segment
};

}  // namespace

SegmentedStep segmented_step(const Shapes& sh, const KernelNames& names, const Slice& slice, const State<Array>& st,
                             const std::vector<Slice>& expert_slices, const std::vector<State<Array>>& expert_states) {
  std::vector<Array> inputs = st.list();
  for (const auto& e : expert_states)
    for (const Array& a : e.list()) inputs.push_back(a);
  Segmenter seg(sh, slice, inputs);
  std::vector<SegValue> sv;
  for (size_t i = 0; i < inputs.size(); ++i) sv.push_back({-1, i, {}});
  const CallFn<SegValue> call = [&](const std::string& k, std::vector<SegValue> in, std::vector<int64_t> at) {
    return seg.call(k, in, std::move(at));
  };
  ExpertIsland<SegValue> island;
  for (size_t j = 0; j < expert_states.size(); ++j)
    island.states.push_back(State<SegValue>::from(std::span(sv).subspan(State<SegValue>::kCount * (j + 1))));
  island.call = [&](int j, const std::string& k, std::vector<SegValue> in, std::vector<int64_t> at) {
    return seg.call(k, in, std::move(at), &expert_slices[static_cast<size_t>(j)]);
  };
  island.route = [&](const SegValue& counts, int j) {
    return seg.cut(counts, &expert_slices[static_cast<size_t>(j)], sh.island_blocks_counts());
  };
  RouteFn<SegValue> route = [&](const SegValue& counts) { return seg.cut(counts, nullptr, sh.route_counts()); };
  if (!expert_states.empty()) route = {};
  return seg.finish(trace_step<SegValue>(sh, names, sh.cfg().mesh.tp, State<SegValue>::from(sv), call, route, nullptr,
                                         expert_states.empty() ? nullptr : &island));
}

std::vector<Array> SegmentedStep::run(Client& client, const std::vector<Array>& in_state, const RunOptions& ro,
                                      const PutFn& put_fn) const {
  std::vector<std::vector<Array>> outs(programs.size());
  std::vector<Array> puts;
  const auto source = [&](const Source& s) -> const Array& {
    return s.seg == kPut ? puts.at(s.index) : s.seg < 0 ? in_state.at(s.index) : outs.at(static_cast<size_t>(s.seg)).at(s.index);
  };
  for (size_t k = 0; k < programs.size(); ++k) {
    std::vector<Array> in;
    for (const Source& s : inputs[k]) in.push_back(source(s));
    outs[k] = client.run(programs[k], in, ro);
    if (k + 1 == programs.size()) break;
    puts.clear();  // the round trips of the cut after segment k
    for (size_t i = 0; i < counts_output[k].size(); ++i) puts.push_back(put_fn(outs[k].at(counts_output[k][i]), i));
  }
  std::vector<Array> result;
  for (const Source& s : outputs) result.push_back(source(s));
  return result;
}

namespace {

// One pipeline's step up to its gradients: stage s on slices[s] with state st[s], the units of
// every micro-batch in the schedule's order, each layer's piece reduced over its stage's dp group.
struct PipelineGrads {
  std::vector<std::vector<Value>> layers;  // per stage: its layers' pieces, in layer order
  Value tied, loss;                        // the tied piece (on stage 0), the loss (on the last stage)
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
  PipelineTracer(ProgramBuilder& b, const Shapes& sh, const KernelNames& names, std::span<const Slice> slices,
                 std::span<const State<Value>> st, int replica)
      : b_(b), sh_(sh), names_(names), slices_(slices), st_(st), replica_(replica),
        S_(static_cast<int>(slices.size())), tp_(sh.cfg().mesh.tp), reduce_(sh.cfg().mesh.dp > 1),
        overlap_(sh.cfg().exec.overlap), plan_(sh.plan(tp_)), M_(plan_.microbatches()), loss_(M_), dhead_(M_),
        tok0_(M_), xout_(S_, std::vector<Value>(M_)), dxout_(xout_),
        xs_(S_, std::vector<std::vector<Value>>(M_)), saved_(xs_), gl_(static_cast<size_t>(plan_.layers())),
        started_(S_) {}

  PipelineGrads trace(Schedule schedule) {
    run_in_order(stage_orders(schedule, S_, M_));
    return finish();
  }

 private:
  struct Started {  // a dp reduction started after a layer's last backward
    int layer;
    Value piece, sum;
  };

  std::vector<Value> call(int s, const std::string& k, std::vector<Value> in, std::vector<int64_t> attrs) {
    return b_.call(k, slices_[static_cast<size_t>(s)], in, std::move(attrs));
  }
  // Replicas: replica r's batch nodes read its rows (ReplicaAttrs::kBatchReplica).
  std::vector<int64_t> batch_attrs(int64_t m) const {
    return replica_ >= 0 ? std::vector<int64_t>{tp_, m, replica_} : std::vector<int64_t>{tp_, m};
  }
  void forward(int s, int64_t m);
  void backward(int s, int64_t m);
  void block_backward(int s, int64_t m, const Unit& u, const StageLayers& sl, Value& dx);
  void run_in_order(const std::vector<std::vector<PipeOp>>& order);
  PipelineGrads finish();

  ProgramBuilder& b_;
  const Shapes& sh_;
  const KernelNames& names_;
  std::span<const Slice> slices_;
  std::span<const State<Value>> st_;
  const int replica_, S_, tp_;
  const bool reduce_;   // the stage's gradient pieces are summed over its dp group
  const bool overlap_;  // ... started as soon as final (dp_reduce_start), else blocking
  const StepPlan& plan_;
  const int64_t M_;
  std::vector<Value> loss_, dhead_, tok0_;
  std::vector<std::vector<Value>> xout_, dxout_;
  std::vector<std::vector<std::vector<Value>>> xs_, saved_;
  std::vector<Value> gl_;  // per layer: the running sum over micro-batches
  Value gEh_, gL_;         // the tied piece's head part (last stage) and lookup part (stage 0)
  std::vector<std::vector<Started>> started_;  // per stage, the dp reductions in start order
};

void PipelineTracer::forward(int s, int64_t m) {
  const StageLayers sl = stage_layers(sh_, s);
  Value x = s == 0 ? Value{} : xout_[s - 1][m], tokens;
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
        std::vector<Value> in(m > 0 ? kHeadTiedPrev + 1 : kHeadTiedPrev);
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
  Value dx = s == S_ - 1 ? dhead_[m] : dxout_[s + 1][m];
  for (const Unit& u : plan_.backward_units(m, sl.begin, sl.end)) {
    if (u.kind == UnitKind::kBlockBackward) {
      block_backward(s, m, u, sl, dx);
      continue;
    }
    // embed_bwd, on stage 0
    std::vector<Value> in(kEBwdTied + 1);
    in[kEBwdTokens] = tok0_[m];
    in[kEBwdDx] = dx;
    in[kEBwdTied] = m > 0 ? gL_ : call(0, names_("zeros"), {}, {tp_, sh_.piece(tp_, StepPlan::kTiedPiece)})[0];
    gL_ = call(0, names_.unit(u, tp_), in, {tp_})[0];
  }
  dxout_[s][m] = dx;  // what stage s-1's backward starts from
}

void PipelineTracer::block_backward(int s, int64_t m, const Unit& u, const StageLayers& sl, Value& dx) {
  const size_t i = static_cast<size_t>(u.layer - sl.begin);
  std::vector<Value> in(m > 0 ? kBwdGradPrev + 1 : kBwdGradPrev);
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

PipelineGrads trace_pipeline(ProgramBuilder& b, const Shapes& sh, const KernelNames& names, Schedule schedule,
                             std::span<const Slice> slices, std::span<const State<Value>> st, int replica) {
  return PipelineTracer(b, sh, names, slices, st, replica).trace(schedule);
}

}  // namespace

Program pipeline_program(const Shapes& sh, const KernelNames& names, Schedule schedule,
                         const std::vector<Slice>& slices, const std::vector<State<Array>>& states) {
  const int S = sh.pipe().stages;
  const int R = sh.cfg().mesh.replicas;  // > 1: R pipelines, one per replica, exchanging gradients
  PWM_CHECK(static_cast<int>(slices.size()) == R * S && states.size() == slices.size(),
            "pipeline_program: {} slices for {} replicas of {} stages", slices.size(), R, S);
  const int tp = sh.cfg().mesh.tp;           // every stage is a dp x tp slice (mesh {dp, tp})
  const int64_t M = sh.plan(tp).microbatches();
  ProgramBuilder b(R > 1 ? fmt::format("pipeline-{}-R{}-S{}-M{}", pwm::train::name(schedule), R, S, M)
                         : fmt::format("pipeline-{}-S{}-M{}", pwm::train::name(schedule), S, M));
  std::vector<State<Value>> all;
  for (const auto& a : states) {
    std::vector<Value> v;
    for (const Array& x : a.list()) v.push_back(b.param_like(x));
    all.push_back(State<Value>::from(v));
  }
  std::vector<PipelineGrads> rep;
  for (int r = 0; r < R; ++r)
    rep.push_back(trace_pipeline(b, sh, names, schedule, std::span(slices).subspan(static_cast<size_t>(r * S), S),
                                 std::span<const State<Value>>(all).subspan(static_cast<size_t>(r * S), S), R > 1 ? r : -1));
  // Replicas: on every replica's stage s, each of the stage's pieces summed over the replicas in
  // replica order (replica_add: the same inputs in the same order everywhere, so the same bits on
  // every replica; the transfers between the replicas' corresponding devices are posted as soon
  // as each piece exists), the tied piece on stage 0.
  auto sum_replicas = [&](int r, int s, int piece, auto pick) {
    if (R == 1) return pick(0);
    std::vector<Value> in;
    for (int q = 0; q < R; ++q) in.push_back(pick(q));
    return b.call(names("replica_add"), slices[static_cast<size_t>(r * S + s)], in, {tp, sh.piece(tp, piece), R})[0];
  };
  for (int r = 0; r < R; ++r) {
    auto call = [&](int s, const std::string& k, std::vector<Value> in, std::vector<int64_t> attrs) {
      return b.call(k, slices[static_cast<size_t>(r * S + s)], in, std::move(attrs));
    };
    // Every stage applies the same update to its copy of the tied embedding. The clipping norm
    // sums every stage's share (the replicas' summed pieces: the same on every replica).
    const Value tied = sum_replicas(r, 0, StepPlan::kTiedPiece, [&](int q) { return rep[q].tied; });
    std::vector<std::vector<Value>> pieces(S);
    std::vector<Value> sq;
    for (int s = 0; s < S; ++s) {
      const StageLayers sl = stage_layers(sh, s);
      pieces[s].push_back(tied);
      for (int l = sl.begin; l < sl.end; ++l)
        pieces[s].push_back(sum_replicas(r, s, StepPlan::layer_piece(l),
                                         [&](int q) { return rep[q].layers[s][static_cast<size_t>(l - sl.begin)]; }));
      sq.push_back(call(s, names("pipe_sqnorm"), pieces[s], {tp, s})[0]);
    }
    const Value total = call(0, names("sum"), sq, {tp, S})[0];
    // The last stage's update takes every replica's loss, in replica order.
    std::vector<Value> losses;
    for (int q = 0; q < R; ++q) losses.push_back(rep[q].loss);
    for (int s = 0; s < S; ++s) {
      const std::vector<Value> l = s == S - 1 ? losses : std::vector<Value>{};
      const State<Value>& state = all[static_cast<size_t>(r * S + s)];
      for (auto& v : call(s, names("pipe_update"), pipe_update_args(sh, s).pack<Value>(state, &total, pieces[s], l), {tp, s}))
        b.output(v);
    }
  }
  return b.build();
}

}  // namespace pwm::pathways::train
