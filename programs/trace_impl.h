// The definitions of trace.h's templates. Include only to instantiate them for a value type of
// your own (trace.cc does it for dataflow::Value); everything else includes trace.h.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <span>
#include <tuple>

#include "common/check.h"
#include "programs/trace.h"

namespace pwm::programs {

using model::StepPlan;
using model::Unit;
using model::UnitKind;

namespace trace_detail {

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
// layer's gradient more per device; docs/pathways_train_fsdp.md has the measurement). Each finish adds
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

}  // namespace trace_detail

namespace trace_detail {

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

}  // namespace trace_detail

template <typename V>
Grads<V> trace_grads(const Shapes& sh, const KernelNames& names, int tp, const State<V>& st, const CallFn<V>& call,
                     int replica, const RouteFn<V>& route, const ExpertIsland<V>* island) {
  const StepPlan& plan = sh.plan(tp);
  const int L = plan.layers();
  std::vector<V> pieces(static_cast<size_t>(plan.num_pieces())), losses;
  std::unique_ptr<trace_detail::IslandNodes<V>> isl;
  if (island) isl = std::make_unique<trace_detail::IslandNodes<V>>(sh, names, tp, call, *island);
  V& tied = pieces[StepPlan::kTiedPiece];
  const int64_t M = plan.microbatches();
  std::unique_ptr<trace_detail::FsdpNodes<V>> fsdp;
  if (sh.cfg().mesh.fsdp) fsdp = std::make_unique<trace_detail::FsdpNodes<V>>(sh, names, tp, st, call);
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

}  // namespace pwm::programs
