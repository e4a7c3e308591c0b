#include "pathways/train/step_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <span>

#include "common/check.h"

namespace pwm::pathways::train {

using model::StepPlan;
using model::Unit;
using model::UnitKind;

namespace {

// --fsdp (chained, opbyop): the gathers and reduce-scatters as nodes of the step, in the order
// spmd_train's Fsdp::accumulate runs them. A piece's weights are gathered (fsdp_gather) before
// the first unit that reads them and dropped after the last (the runtime frees an array when its
// last reader ends): the tied pieces once for the whole step (embed_fwd and every head), layer l
// before its forward and again before its backward, except that the last layer's backward reuses
// its forward's and layer 0's next forward its backward's. Layer l's full gradient (block_bwd's
// output) is reduce-scattered into its chunk: fsdp_rs_start right after block_bwd(l), and
// fsdp_rs_finish after the gather of layer l - 1 (after embed_bwd for layer 0), so that the two
// collectives run at once, as Fsdp::accumulate runs them (or one blocking fsdp_reduce_scatter with
// --no-overlap). Not across block_bwd(l - 1): the runtime progresses a collective only between
// kernels and inside waits (no progress thread), so the sum would be complete when block_bwd(l - 1)
// starts anyway, and the gradient it reads would be held through that backward for nothing (a
// layer's gradient more per device; docs/pathways_train.md has the measurement). Each finish adds
// the chunk so far (the previous micro-batches'), as Fsdp::accumulate adds into the shard: the
// same sums in the same order, the same bits.
//
// It also counts what the device holds beyond its state: the gathered weights, the full layer
// gradients and the started chunks live at once, at most (Grads::fsdp_held, the state_bytes
// figure of docs/train.md), from the node order and each array's last reader.
template <typename V>
class FsdpNodes {
 public:
  FsdpNodes(const Shapes& sh, const KernelNames& names, int tp, const State<V>& st, const CallFn<V>& call)
      : sh_(sh), names_(names), tp_(tp), st_(st), call_(call), overlap_(sh.cfg().exec.overlap) {
    const size_t L = static_cast<size_t>(sh.plan(tp).layers());
    chunks_.resize(L);
    has_chunk_.resize(L);
    layers_.resize(L);
  }

  // The gathered weights of layer l (l < 0: the tied pieces'), gathered unless held.
  V weights(int l) {
    Held& h = held(l);
    if (!h.live) {
      h.value = call_(names_("fsdp_gather"), {st_.params}, {tp_, l})[0];
      h.live = true;
      alloc(gathered_bytes(l));
    }
    return h.value;
  }
  // After a unit read layer l's (or the tied) weights: dropped unless `keep` (the tied pieces'
  // stay counted: the device holds them to tied_reduce_scatter, after the step's backward).
  void read(int l, bool keep) {
    Held& h = held(l);
    if (keep || !h.live) return;
    h.live = false;
    if (l >= 0) free(gathered_bytes(l));
  }
  // block_bwd(l) made `grad` (the unit read layer l's weights: dropped unless `keep_weights`).
  void backward(int l, const V& grad, bool keep_weights) {
    alloc(gathered_bytes(l));  // the gradient, while the weights are still live
    read(l, keep_weights);
    if (!overlap_) {  // (its kernel reduce-scatters into a chunk of its own, then adds)
      alloc(chunk_bytes(l));
      chunks_[static_cast<size_t>(l)] = finish(names_("fsdp_reduce_scatter"), l, {grad});
      free(gathered_bytes(l) + chunk_bytes(l));
      return;
    }
    PWM_CHECK(!pending_.live, "fsdp: layer {}'s reduce-scatter is still open", pending_.layer);
    alloc(chunk_bytes(l));
    V started = call_(names_("fsdp_rs_start"), {grad}, {tp_, l})[0];
    pending_ = {l, grad, started, true};
  }
  // The started reduce-scatter finished (if one is): after the next layer's gather, before its
  // backward, or after embed_bwd.
  void finish_pending() {
    if (!pending_.live) return;
    const int l = pending_.layer;
    chunks_[static_cast<size_t>(l)] = finish(names_("fsdp_rs_finish"), l, {pending_.grad, pending_.started});
    free(gathered_bytes(l) + chunk_bytes(l));
    pending_.live = false;
  }
  const V& chunk(int l) const { return chunks_[static_cast<size_t>(l)]; }
  int64_t peak() const { return peak_; }
  // Counted: `bytes` made at a node's start (its outputs exist while it runs), freed after its
  // last reader.
  void alloc(int64_t bytes) { peak_ = std::max(peak_, live_ += bytes); }
  void free(int64_t bytes) { live_ -= bytes; }

 private:
  struct Held {
    V value;
    bool live = false;
  };
  struct Pending {
    int layer = -1;
    V grad, started;
    bool live = false;
  };
  Held& held(int l) { return l < 0 ? tied_ : layers_[static_cast<size_t>(l)]; }
  // (The tied pieces' weights: in the device's Fsdp, from their gather to tied_reduce_scatter.)
  int64_t gathered_bytes(int l) const {
    return 4 * (l < 0 ? sh_.fsdp_gathered_tied(tp_) : sh_.fsdp_gathered_layer(tp_, l));
  }
  int64_t chunk_bytes(int l) const { return 4 * sh_.fsdp_chunk(tp_, 1 + l); }
  V finish(const std::string& k, int l, std::vector<V> in) {
    const bool prev = has_chunk_[static_cast<size_t>(l)];
    if (prev) in.push_back(chunks_[static_cast<size_t>(l)]);
    has_chunk_[static_cast<size_t>(l)] = true;
    return call_(k, std::move(in), {tp_, l, prev ? 1 : 0})[0];
  }

  const Shapes& sh_;
  const KernelNames& names_;
  const int tp_;
  const State<V>& st_;
  const CallFn<V>& call_;
  const bool overlap_;
  std::vector<V> chunks_;        // per layer: the chunk so far
  std::vector<bool> has_chunk_;  // (V has no empty state common to Value and Array)
  Held tied_;
  std::vector<Held> layers_;
  Pending pending_;
  int64_t live_ = 0, peak_ = 0;
};

}  // namespace

namespace {

// --expert-island: an MoE layer's block around the experts' devices (island_kernels.cc). The
// experts' outputs of a micro-batch's layer stay alive to its backward (expert_bwd reads them:
// the experts' devices keep the layer's state under them).
template <typename V>
class IslandNodes {
 public:
  IslandNodes(const Shapes& sh, const KernelNames& names, int tp, const CallFn<V>& call, const ExpertIsland<V>& island)
      : names_(names), tp_(tp), P_(static_cast<int>(island.states.size())), call_(call), island_(island),
        z_(static_cast<size_t>(sh.plan(tp).layers())), pieces_(island.states.size(),
                                                               std::vector<V>(static_cast<size_t>(sh.plan(tp).layers()))),
        has_piece_(static_cast<size_t>(sh.plan(tp).layers()), false) {}

  // x(l+1) and saved(l) from x(l), of micro-batch m.
  std::pair<V, V> forward(int l, int64_t m, const V& weights, const V& x) {
    auto o = call_(names_("moe_send"), {weights, x}, {tp_, l, m});
    std::vector<V> in(o.begin(), o.begin() + 2);  // x(l+1) without the branch, saved(l); then the outputs
    auto& z = z_[static_cast<size_t>(l)];
    z.clear();
    std::vector<V> counts(o.begin() + 2 + P_, o.begin() + 2 + 2 * P_);
    if (island_.route)  // the controller's routing: every round trip before the experts' calls
      for (int j = 0; j < P_; ++j) counts[static_cast<size_t>(j)] = island_.route(counts[static_cast<size_t>(j)], j);
    for (int j = 0; j < P_; ++j) {
      z.push_back(island_.call(j, names_("expert_fwd"), {param(j), o[2 + j], counts[static_cast<size_t>(j)]}, {tp_, l, j})[0]);
      in.push_back(z.back());
    }
    return {call_(names_("moe_combine"), in, {tp_, l})[0], o[1]};
  }
  // block_bwd_remote's outputs (d/dx(l), the layer's piece) from block_bwd's inputs `in`.
  std::vector<V> backward(int l, std::vector<V> in, bool acc) {
    auto d = call_(names_("moe_bwd_send"), {in[kBwdSaved], in[kBwdDx]}, {tp_, l});
    const size_t li = static_cast<size_t>(l);
    for (int j = 0; j < P_; ++j) {
      std::vector<V> e{param(j), z_[li][static_cast<size_t>(j)], d[static_cast<size_t>(j)]};
      V& g = pieces_[static_cast<size_t>(j)][li];
      if (has_piece_[li]) e.push_back(g);
      auto r = island_.call(j, names_(has_piece_[li] ? "expert_bwd_acc" : "expert_bwd"), e, {tp_, l, j});
      in.push_back(r[0]);
      g = r[1];
    }
    has_piece_[li] = true;
    return call_(names_(acc ? "block_bwd_remote_acc" : "block_bwd_remote"), in, {tp_, l});
  }
  // Per experts' device, its pieces of the MoE layers in layer order.
  std::vector<std::vector<V>> pieces() const {
    std::vector<std::vector<V>> out(pieces_.size());
    for (size_t j = 0; j < pieces_.size(); ++j)
      for (size_t l = 0; l < has_piece_.size(); ++l)
        if (has_piece_[l]) out[j].push_back(pieces_[j][l]);
    return out;
  }

 private:
  V param(int j) const { return island_.states[static_cast<size_t>(j)].params; }
  const KernelNames& names_;
  const int tp_, P_;
  const CallFn<V>& call_;
  const ExpertIsland<V>& island_;
  std::vector<std::vector<V>> z_;       // per layer, the experts' outputs of the current micro-batch
  std::vector<std::vector<V>> pieces_;  // per experts' device and layer
  std::vector<bool> has_piece_;
};

}  // namespace

template <typename V>
Grads<V> trace_grads(const Shapes& sh, const KernelNames& names, int tp, const State<V>& st, const CallFn<V>& call,
                     int replica, const RouteFn<V>& route, const ExpertIsland<V>* island) {
  const StepPlan& plan = sh.plan(tp);
  const int L = plan.layers();
  std::vector<V> pieces(static_cast<size_t>(plan.num_pieces())), losses;
  std::unique_ptr<IslandNodes<V>> isl;
  if (island) isl = std::make_unique<IslandNodes<V>>(sh, names, tp, call, *island);
  V& tied = pieces[StepPlan::kTiedPiece];
  const int64_t M = plan.microbatches();
  std::unique_ptr<FsdpNodes<V>> fsdp;
  if (sh.cfg().mesh.fsdp) fsdp = std::make_unique<FsdpNodes<V>>(sh, names, tp, st, call);
  // The weights unit `layer` reads (-1: the tied pieces'): the state's, or with --fsdp gathered.
  const auto weights = [&](int layer) { return fsdp ? fsdp->weights(layer) : st.params; };
  for (int64_t m = 0; m < M; ++m) {
    const bool acc = m > 0;  // the backward units add to the previous micro-batch's pieces
    V tokens, x, dx;
    std::vector<V> xs(static_cast<size_t>(L)), saved(static_cast<size_t>(L));  // per layer: x(l), saved(l)
    for (const Unit& u : plan.forward_units(m)) {
      const std::string k = names.unit(u, tp);
      switch (u.kind) {
        case UnitKind::kBatch:
          tokens = call(k, {st.step}, replica < 0 ? std::vector<int64_t>{tp, m} : std::vector<int64_t>{tp, m, replica})[0];
          break;
        case UnitKind::kEmbedForward: x = call(k, {weights(-1), tokens}, {tp})[0]; break;
        case UnitKind::kBlockForward: {
          xs[u.layer] = x;
          if (isl && sh.moe_layer(u.layer)) {
            std::tie(x, saved[u.layer]) = isl->forward(u.layer, m, weights(u.layer), x);
            break;
          }
          std::vector<V> in;  // (built by push_back: an initializer list here drew a false -Warray-bounds from GCC 12)
          in.reserve(3);
          in.push_back(weights(u.layer));
          in.push_back(x);
          std::vector<int64_t> at{tp, u.layer};
          if (route && sh.moe_layer(u.layer)) {  // the controller sizes the layer's expert call
            in.push_back(route(call(names("moe_counts"), {st.params, x}, {tp, u.layer})[0]));
            at.push_back(1);
          }
          auto o = call(names.unit(u, tp, sh.expert_exchange(u.layer)), in, at);
          x = o[0];
          saved[u.layer] = o[1];
          if (fsdp) fsdp->read(u.layer, u.layer == L - 1);  // the last layer's backward follows
          break;
        }
        case UnitKind::kHead: {
          std::vector<V> in(acc ? kHeadTiedPrev + 1 : kHeadTiedPrev);
          in[kHeadParams] = weights(-1);
          // (The tied piece's whole gradient lives from the first head to its reduce-scatter.)
          if (fsdp && !acc) fsdp->alloc(4 * sh.piece(tp, StepPlan::kTiedPiece));
          in[kHeadX] = x;
          in[kHeadTokens] = tokens;
          if (acc) in[kHeadTiedPrev] = tied;
          auto h = call(k, in, {tp});
          losses.push_back(h[kHeadLoss]);
          dx = h[kHeadDx];
          tied = h[kHeadTied];
          if (fsdp) fsdp->read(-1, m < M - 1);  // held for the step's heads
          break;
        }
        default: PWM_THROW("{} is not a forward unit", model::unit_kind_name(u.kind));
      }
    }
    for (const Unit& u : plan.backward_units(m)) {
      const std::string k = names.unit(u, tp, u.kind == UnitKind::kBlockBackward && sh.expert_exchange(u.layer));
      if (u.kind == UnitKind::kBlockBackward) {
        V& g = pieces[static_cast<size_t>(plan.piece_of(u))];
        // (--fsdp: the micro-batch's full layer gradient, reduce-scattered and added by the
        // FsdpNodes' nodes: block_bwd never adds.)
        const bool add = acc && !fsdp;
        std::vector<V> in(add ? kBwdGradPrev + 1 : kBwdGradPrev);
        in[kBwdParams] = weights(u.layer);
        if (fsdp) fsdp->finish_pending();  // the previous layer's, beside this layer's gather
        in[kBwdSaved] = saved[u.layer];
        in[kBwdX] = xs[u.layer];
        in[kBwdDx] = dx;
        if (add) in[kBwdGradPrev] = g;
        if (isl && sh.moe_layer(u.layer)) {
          auto b = isl->backward(u.layer, std::move(in), add);
          dx = b[kBwdDxOut];
          g = b[kBwdGrad];
          continue;
        }
        auto b = call(add || !acc ? k : names.unit(model::Unit{u.kind, 0, u.layer}, tp), in, {tp, u.layer});
        dx = b[kBwdDxOut];
        g = b[kBwdGrad];
        if (fsdp) fsdp->backward(u.layer, g, u.layer == 0 && m < M - 1);  // layer 0's next forward follows
      } else {  // embed_bwd
        std::vector<V> in(kEBwdTied + 1);
        in[kEBwdTokens] = tokens;
        in[kEBwdDx] = dx;
        in[kEBwdTied] = tied;
        tied = call(k, in, {tp})[0];
        if (fsdp) fsdp->finish_pending();
      }
    }
  }
  if (!fsdp) return {std::move(pieces), std::move(losses), 0, isl ? isl->pieces() : std::vector<std::vector<V>>{}};
  for (int l = 0; l < L; ++l) pieces[static_cast<size_t>(StepPlan::layer_piece(l))] = fsdp->chunk(l);
  return {std::move(pieces), std::move(losses), fsdp->peak(), {}};
}

template <typename V>
std::vector<V> trace_step(const Shapes& sh, const KernelNames& names, int tp, const State<V>& st, const CallFn<V>& call,
                          const RouteFn<V>& route, int64_t* fsdp_held, const ExpertIsland<V>* island) {
  const StepPlan& plan = sh.plan(tp);
  Grads<V> g = trace_grads(sh, names, tp, st, call, -1, route, island);
  if (fsdp_held != nullptr) *fsdp_held = g.fsdp_held;
  if (sh.cfg().mesh.fsdp) {
    // --fsdp: the layers' pieces are already their dp chunks (block_bwd reduce-scatters each
    // micro-batch's gradient, as spmd_train's Fsdp); the tied piece is reduce-scattered once, and
    // the update takes the chunks in the shard's order.
    const int L = static_cast<int>(sh.cfg().model.n_layers);
    std::vector<V> tied = call(names("tied_reduce_scatter"), {g.pieces[StepPlan::kTiedPiece]}, {tp});
    std::vector<V> in = st.list();
    in.push_back(tied[0]);
    for (int l = 0; l < L; ++l) in.push_back(g.pieces[static_cast<size_t>(StepPlan::layer_piece(l))]);
    in.push_back(tied[1]);
    in.insert(in.end(), g.losses.begin(), g.losses.end());
    return call(names("sharded_update"), in, {tp});
  }
  std::vector<V> reduced;
  for (int i = 0; i < plan.num_pieces(); ++i) {
    std::vector<int64_t> at{tp, sh.piece(tp, i), sh.piece(tp, i), i};
    // An MoE layer's piece under --expert-parallel: its dense part is summed over dp, its
    // experts over the devices holding the same ones (dp_allreduce's third attribute). The
    // fourth, the piece's index: every element summed as spmd_train's buckets sum it.
    const int l = i - 1;  // piece i > 0 is layer i - 1's (StepPlan::layer_piece)
    if (i != StepPlan::kTiedPiece && sh.expert_exchange(l)) {
      PWM_CHECK_EQ(StepPlan::layer_piece(l), i);
      const model::LayerOffsets& lo = sh.layout(tp).layer(l);
      at[2] = lo.expert_gate_up - lo.begin;
    }
    reduced.push_back(call(names("dp_allreduce"), {g.pieces[static_cast<size_t>(i)]}, at)[0]);
  }
  std::vector<V> in = update_args(sh, tp).pack<V>(st, nullptr, reduced, g.losses);
  if (!island) return call(names("update"), in, {tp});
  const int P = static_cast<int>(island->states.size());
  for (int j = 0; j < P; ++j)
    in.push_back(island->call(j, names("expert_sqnorm"), g.expert_pieces[static_cast<size_t>(j)], {tp, j})[0]);
  std::vector<V> out = call(names("update"), in, {tp, 1});
  const V shared = out.back();
  out.pop_back();
  for (int j = 0; j < P; ++j) {
    std::vector<V> e = island->states[static_cast<size_t>(j)].list();
    e.push_back(shared);
    for (const V& p : g.expert_pieces[static_cast<size_t>(j)]) e.push_back(p);
    for (V& v : island->call(j, names("expert_update"), e, {tp, j})) out.push_back(std::move(v));
  }
  return out;
}

template std::vector<Value> trace_step(const Shapes&, const KernelNames&, int, const State<Value>&, const CallFn<Value>&,
                                       const RouteFn<Value>&, int64_t*, const ExpertIsland<Value>*);
template std::vector<Array> trace_step(const Shapes&, const KernelNames&, int, const State<Array>&, const CallFn<Array>&,
                                       const RouteFn<Array>&, int64_t*, const ExpertIsland<Array>*);
template Grads<Value> trace_grads(const Shapes&, const KernelNames&, int, const State<Value>&, const CallFn<Value>&, int,
                                  const RouteFn<Value>&, const ExpertIsland<Value>*);

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
