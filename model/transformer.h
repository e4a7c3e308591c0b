// The PaLM-style decoder, forward and backward by hand, over one tensor-parallel shard.
//
//   x0 = embed[tokens[:, :T]]                                   [N, C], N = B*T
//   for each layer l:  h = Norm_l(x);  x = x + Attn(h) + MLP(h)   (parallel block, one norm)
//     Attn: multi-query, causal; q = rope(h wq^T) [N, H, D], k = rope(h wk^T), v = h wv^T [N, D]
//           a = softmax(q k^T / sqrt(D)) v  [N, H*D];  attn_out = a . wo
//     MLP:  g = silu(h w_gate^T) * (h w_up^T)  [N, F];  mlp_out = g . w_down
//   logits = FinalNorm(x) . embed^T  [N, V]
//   loss = mean_n( lse_n - logits[n, target_n] + z_loss * lse_n^2 ),  targets = tokens[:, 1:]
//
// Tensor parallelism (Megatron style): a tp rank holds H/tp query heads (rows of wq and wo) and
// F/tp MLP columns (rows of w_gate, w_up, w_down); the K/V head, the norms and the embedding are
// replicated. Each block sums its attention and MLP outputs locally into ONE partial [N, C] that
// the caller's `tp_allreduce` sums over the tp group: one reduction per block forward, one per
// block backward (d(normed x) [N, C] plus the partial grads of wk, wv [2, D, C]). After backward,
// the gradients of replicated parameters are complete and identical on every tp rank, so a
// trainer only needs a dp AllReduce of the whole gradient buffer. The model never calls MPI.
//
// Gradient convention: every backward ACCUMULATES into `grads` (same layout as params):
// grads += grad_scale * d(mean micro-batch loss)/d(params). Zero it yourself between steps.
// Within one micro-batch's backward, a tensor's gradient is final as soon as the piece that
// last touches it returns: final_norm after head_backward, layer l after block_backward(l),
// embed after embed_backward (head_backward adds the output projection's part first), so a
// trainer can start reducing gradient buckets in that order while the backward continues.
// Nothing here allocates after construction of Activations / Scratch; all of it is
// single-threaded and deterministic.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/lazy_array.h"
#include "model/config.h"
#include "model/moe.h"
#include "model/params.h"

namespace pwm::model {

// Query rows per causal block of the attention GEMMs (transformer_block.cc): blocks skip the
// keys above the diagonal (10/16 of the full score work at T = 128). gemm_probe.h lists the same
// products.
constexpr int64_t kAttentionQueryBlock = 32;

// Sums `count` elements at `data` in place over the tp group. Empty (or a no-op) for tp = 1.
template <typename S>
using TpReduce = std::function<void(S* data, size_t count)>;

// A span of S: what the saved-state fields are (owned by Activations or bound to memory outside).
template <typename S>
struct View {
  S* ptr = nullptr;
  size_t n = 0;
  S* data() { return ptr; }
  const S* data() const { return ptr; }
  size_t size() const { return n; }
  S& operator[](size_t i) { return ptr[i]; }
  const S& operator[](size_t i) const { return ptr[i]; }
};

// Everything one micro-batch keeps between its forward and its backward, for the layers
// [layer_begin, layer_end) (a pipeline stage may hold a range) plus the head. Owns its memory,
// except what is re-bound with bind_*: a runtime that keeps activations in buffers of its own
// (the Pathways object store) points the state at them for the duration of a call.
template <typename S>
class Activations {
 public:
  Activations(const ParamLayout& layout, int64_t B, int layer_begin = 0, int layer_end = -1);

  int64_t B() const { return B_; }
  int64_t N() const { return B_ * T_; }
  int layer_begin() const { return l0_; }
  int layer_end() const { return l1_; }
  // Residual stream at the input of block l, l in [layer_begin, layer_end]: [N, C].
  // x(layer_end) is the block range's output (x(L) feeds the head). A pipeline stage writes its
  // input into x(layer_begin) before block_forward(layer_begin).
  S* x(int l);
  const S* x(int l) const;
  // Gradient of the loss w.r.t. the residual stream where the backward currently is: [N, C].
  // head_backward sets it to d/dx(L); block_backward(l) turns d/dx(l+1) into d/dx(l);
  // embed_backward consumes d/dx(0). A pipeline stage writes the received gradient here.
  S* dx() { return dx_ptr_; }
  const S* dx() const { return dx_ptr_; }

  struct Layer {
    View<S> mean, rstd;  // [N] norm statistics
    View<S> h;           // [N, C] normed input
    View<S> yin;         // [N, R_in] h . w_in^T: k | v | q | gate | up (pre-rope)
    View<S> q;           // [N, Hs, D] rope(q) / sqrt(D)
    View<S> k;           // [N, D] rope(k)
    View<S> p;           // [B, T*Hs, T] attention probabilities, rows (t, h)
    View<S> ag;          // [N, R_out] attention output a | swiglu output g
  };
  Layer& layer(int l);
  const Layer& layer(int l) const;

  // Elements of one layer's saved state (the fields of Layer, contiguous in that order).
  static int64_t layer_elements(const ParamLayout& layout, int64_t B);
  // Re-point layer l's saved state at `memory` (layer_elements), x(l) at `memory` ([N, C]), or
  // dx() at `memory` ([N, C]). The caller keeps the memory alive while it is bound.
  void bind_layer(int l, S* memory);
  void bind_x(int l, S* memory);
  void bind_dx(S* memory) { dx_ptr_ = memory; }
  // Points everything back at the owned memory (after a call that bound outside buffers).
  void unbind_all();

  // Mixture-of-Experts state of layer l (an MoE layer of the range): routing, expert rows.
  MoeState<S>& moe(int l);
  const MoeState<S>& moe(int l) const;
  // Re-point layer l's MoE state at `state` (the caller keeps it alive while bound; unbind_all
  // points it back). A forward that keeps nothing for a backward (an evaluation) may give every
  // MoE layer one state: each layer's rows are dead once its block is done.
  void bind_moe(int l, MoeState<S>* state);
  // The MoE layers' statistics of the last forward over the range (summed over its MoE layers).
  MoeStats moe_stats() const;
  // The grad_scale of the backward under way (head_backward sets it): the MoE layers scale their
  // aux losses' gradients by it, as the head scales the loss's.
  S loss_scale = S(1);

  // Head state.
  std::vector<S> f_mean, f_rstd;  // [N]
  std::vector<S> hf;              // [N, C] final-normed x(L)
  std::vector<S> probs;           // [N, V] softmax of the logits
  std::vector<S> lse;             // [N] log-sum-exp of the logits
  std::vector<S> rope;            // [T, D] cos | sin table

 private:
  int64_t B_, T_, C_;
  int l0_, l1_;
  // The layers' inputs and saved state: reserved, resident only where written (a runtime that
  // binds its own buffers for every call, pathways_train's unit kernels, never touches them).
  LazyArray<S> xs_;  // [(l1 - l0 + 1), N, C]
  std::vector<S> dx_;  // [N, C]
  LazyArray<S> arena_;  // [(l1 - l0), layer_elements]
  std::vector<Layer> layers_;
  std::vector<MoeState<S>> moe_;  // per layer of the range (empty vectors for dense layers)
  std::vector<MoeState<S>*> moe_ptr_;  // moe(l) for l in [l0, l1)
  std::vector<S*> x_ptr_;  // x(l) for l in [l0, l1]
  S* dx_ptr_ = nullptr;
  int64_t D_, Hs_, Rin_, Rout_;  // head dim, local heads, fused matrix rows (for bind_layer)
};

// Temporaries reused across calls (no state carried between calls). One per thread of work.
template <typename S>
class Scratch {
 public:
  Scratch(const ParamLayout& layout, int64_t B);
  int64_t B;
  std::vector<S> dyin;     // [N, R_in]
  std::vector<S> dag;      // [N, R_out]
  std::vector<S> reduce;   // [N*C + 2*D*C] backward tp reduction: d(h) | d(wk) | d(wv)
  std::vector<S> att;      // [T*Hs, T] dP / dS of one sequence
  std::vector<S> o;        // [T*Hs, D] attention output / its gradient, one sequence
  std::vector<S> dq;       // [T*Hs, D]
  std::vector<S> dk;       // [T, D]
  std::vector<S> dlogits;  // [N, V]
  std::vector<S> dhf;      // [N, C]
  MoeScratch<S> moe;       // the MoE layers' temporaries (grown on first use)
};

// Activations for all layers plus scratch: what forward_backward needs for micro-batches of B.
template <typename S>
struct Workspace {
  Workspace(const ParamLayout& layout, int64_t B) : act(layout, B), scratch(layout, B) {}
  Activations<S> act;
  Scratch<S> scratch;
};

// ---- Pieces (a Pathways runtime runs them as separate nodes; a pipeline runs a layer range) ----
// `tokens` is [B, T+1] int32 row-major: inputs tokens[:, :T], targets tokens[:, 1:].
// params/grads: this tp rank's buffers of layout.total() elements.

// x(0) = embed[tokens[:, :T]].
template <typename S>
void embed_forward(const ParamLayout& layout, const S* params, const int32_t* tokens,
                   Activations<S>& act);
// x(l+1) = x(l) + tp_allreduce(attn_partial + mlp_partial). An MoE layer's MLP branch is
// model/moe.h's, its rows moved over `ep` when the experts are split (P > 1; then every rank of
// the expert-parallel group must call, in the same order). With ep.at = kRemote the MoE branch
// stops at moe_pack: x(l+1) lacks it until the caller's moe_combine.
template <typename S>
void block_forward(const ParamLayout& layout, const S* params, int layer, Activations<S>& act,
                   Scratch<S>& scratch, const TpReduce<S>& tp_allreduce,
                   const ExpertComm<S>& ep = ExpertComm<S>{});
// The rows an MoE layer l's forward sends to each expert from x(l) (the block's norm, then
// moe_expert_rows): what block_forward's expert exchange will carry, computed ahead of it. The
// same bits as the forward's. Uses act.moe(l) and act.layer(l)'s norm buffers as scratch.
template <typename S>
std::vector<int64_t> block_expert_rows(const ParamLayout& layout, const S* params, int layer, Activations<S>& act,
                                       Scratch<S>& scratch);
// Final norm, logits, loss; returns the micro-batch mean loss. Identical on every tp rank.
template <typename S>
S head_forward(const ParamLayout& layout, const S* params, const int32_t* tokens,
               Activations<S>& act);
// Seeds the backward: act.dx() = grad_scale * d(mean loss)/dx(L); accumulates the output-
// projection part of grads["embed"] and grads["final_norm"].
template <typename S>
void head_backward(const ParamLayout& layout, const S* params, S* grads, const int32_t* tokens,
                   S grad_scale, Activations<S>& act, Scratch<S>& scratch);
// The same, accumulating into the two gradients wherever they are held (a runtime whose gradient
// pieces are separate buffers): embed [V, C] and final_norm [C].
template <typename S>
struct HeadGrads {
  S* embed;
  S* final_norm;
};
template <typename S>
void head_backward(const ParamLayout& layout, const S* params, HeadGrads<S> grads, const int32_t* tokens,
                   S grad_scale, Activations<S>& act, Scratch<S>& scratch);
// act.dx(): d/dx(l+1) -> d/dx(l); accumulates the grads of layer l. One tp_allreduce call.
// With ep.at = kRemote an MoE layer's branch is moe_backward_finish on act.moe(l).dxback.
template <typename S>
void block_backward(const ParamLayout& layout, const S* params, S* grads, int layer,
                    Activations<S>& act, Scratch<S>& scratch, const TpReduce<S>& tp_allreduce,
                    const ExpertComm<S>& ep = ExpertComm<S>{});
// grads["embed"][tokens[b, t]] += act.dx()[b*T + t] (the lookup's part of the tied embedding).
template <typename S>
void embed_backward(const ParamLayout& layout, S* grads, const int32_t* tokens,
                    const Activations<S>& act);

// ---- Whole micro-batch ------------------------------------------------------------------------

// The composition embed -> blocks -> head -> head_backward -> blocks reversed -> embed_backward.
// grads += grad_scale * d(objective)/d(params), objective = mean loss + the MoE layers' aux
// losses; returns the mean loss (without the aux losses). B must equal ws's B.
template <typename S>
S forward_backward(const ParamLayout& layout, const S* params, S* grads, const int32_t* tokens,
                   int64_t B, S grad_scale, Workspace<S>& ws, const TpReduce<S>& tp_allreduce,
                   const ExpertComm<S>& ep = ExpertComm<S>{});
// Mean loss only (evaluation). The MoE layers' aux losses are not in it (ws.act.moe_stats()).
template <typename S>
S forward_loss(const ParamLayout& layout, const S* params, const int32_t* tokens, int64_t B,
               Workspace<S>& ws, const TpReduce<S>& tp_allreduce,
               const ExpertComm<S>& ep = ExpertComm<S>{});

}  // namespace pwm::model
