// Mixture of Experts: the MLP branch of an MoE block (docs/model_moe.md "Mixture of Experts").
//
//   logits = h . router^T + skew            [N, E] float32 (also under bf16: no gemm<float>)
//   p = softmax(logits);  top_k experts per token, ties to the lower index;  gate = p of a chosen
//   expert (K = 1), renormalized over the K chosen (K > 1)
//   capacity: choices are taken in token order (n, then k); an expert takes at most
//   ceil(capacity_factor K N / E) rows (capacity_factor 0: dropless, no limit); a dropped
//   choice contributes zero to the MLP branch (the token keeps its residual and attention)
//   expert e:  z = swiglu(x . w_gate_up_e^T) . w_down_e;   out[n] += sum_k gate_k z_k
//   aux losses, added to the objective per MoE layer (not to the reported loss):
//     aux_loss * E sum_i f_i P_i   (f_i = choices of expert i / (N K), P_i = mean_n p_n,i)
//     router_z_loss * mean_n logsumexp(logits_n)^2
// N is the routing group: one micro-batch of one data-parallel rank.
//
// Expert parallelism: the experts are split over the P ranks of an ExpertComm (rank r holds
// experts [r E/P, (r+1) E/P)). Each rank routes its own tokens; the rows for every expert go to
// the expert's rank in ONE AllToAll (expert-major, so rank-major), the outputs come back in a
// second; the backward sends the outputs' gradients and returns the inputs' the same way. With a
// capacity every (rank, expert) block is `capacity` rows, padded with zeros (equal counts: the
// static shapes of GShard); dropless sends the real rows and exchanges the counts first.
//
// Remote experts (ExpertComm::at = kRemote, pathways_train --expert-island): the experts live on
// devices of their own, which are not members of the tokens' group. The tokens' device runs the
// router and the combine (moe_pack, moe_combine, moe_backward_combine, moe_backward_finish); the
// experts' device runs the experts on the rows of every tokens' device (moe_experts_forward,
// moe_experts_backward); the caller moves the rows between them. The same products in the same
// order as moe_forward / moe_backward with the same P: the same bits.
//
// Blocking: moe_forward/moe_backward call the ExpertComm (which blocks) when P > 1. One thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/params.h"

namespace pwm::model {

// Where an MoE layer's experts run, for block_forward / block_backward.
enum class ExpertsAt {
  kHere,    // on the members of the ExpertComm's group, rows moved by its AllToAll
  kRemote,  // elsewhere: block_forward stops after moe_pack (the caller moves sc.sent's rows to
            // the experts and calls moe_combine with their outputs in st.back); block_backward's
            // MoE branch runs moe_backward_finish on st.dxback (the caller ran
            // moe_backward_combine and moved the experts' input gradients there)
};

// The expert-parallel group's AllToAll, supplied by the trainer (the model never calls MPI).
template <typename S>
struct ExpertComm {
  int size = 1;  // P; 1: every expert is local and the functions are not called
  ExpertsAt at = ExpertsAt::kHere;  // kRemote: the functions are never called
  // send[p * per + j] goes to rank p; recv[p * per + j] arrives from rank p.
  std::function<void(const int64_t* send, int64_t* recv, int64_t per)> counts;
  // send holds send_rows[p] rows of `width` elements for each rank p, in rank order; recv
  // receives recv_rows[p] rows from each rank p, in rank order.
  std::function<void(const S* send, const int64_t* send_rows, S* recv, const int64_t* recv_rows, int64_t width)>
      rows;
};

// What the MoE layers did for one micro-batch on this rank (summed over its MoE layers).
struct MoeStats {
  int64_t choices = 0;       // token-expert choices (N K per layer)
  int64_t dropped = 0;       // choices over an expert's capacity
  int64_t expert_rows = 0;   // rows the local experts computed, padding included. Over a whole
                             // expert-parallel group, padding = expert_rows - (choices - dropped)
  std::vector<int64_t> expert_tokens;  // [E] choices per expert, before capacity
  std::vector<int64_t> call_tokens;    // [calls x E] expert_tokens of each routing call (one MoE
                                       // layer, one micro-batch), in the order added: the
                                       // per-call loads a device's imbalance is taken from
  double lb_loss = 0;        // E sum_i f_i P_i (unweighted; 1 when perfectly balanced)
  double z_loss = 0;         // mean_n logsumexp^2 (unweighted)
  void add(const MoeStats& o);
};

// What one MoE layer keeps between the forward and the backward of a micro-batch. Sized on use.
template <typename S>
struct MoeState {
  std::vector<S> probs;             // [N, E]
  std::vector<S> lse;               // [N]
  std::vector<int32_t> choice;      // [N, K]
  std::vector<S> gate;              // [N, K]
  std::vector<int64_t> slot;        // [N, K] row in the dispatched buffer, -1 dropped
  std::vector<int64_t> expert_rows; // [E] rows per expert in the dispatched buffer (expert-major)
  std::vector<int64_t> block_rows;  // [P * El] rows the local experts got from each (rank, expert)
  std::vector<int64_t> send_rows, recv_rows;  // [P] rows to / from each rank
  std::vector<S> xe;                // [R, C] the local experts' input rows (rank-major, expert)
  std::vector<S> ye;                // [R, 2F] gate | up pre-activations
  std::vector<S> ge;                // [R, F] SwiGLU outputs
  std::vector<S> back;              // [dispatched rows, C] the experts' outputs, back here
  std::vector<S> dgate;             // [N, K] the gates' gradients (moe_backward_combine)
  std::vector<S> dxback;            // remote experts: [dispatched rows, C] the rows' gradients, back here
  MoeStats stats;
};

// Temporaries of the MoE layers (grown on use, reused across calls).
template <typename S>
struct MoeScratch {
  std::vector<S> logits, sent, z, dback, dz, dge, dye, dxe, dxback, dlogits;
};

// Routing of one group: logits [N, E] in (any values; the skew already added) -> probabilities,
// log-sum-exp, choices, gates, slots, expert_rows, the aux losses' values and the counts in
// st.stats (expert_rows/padding not yet). Pure; exposed for tests of capacity and dropping.
template <typename S>
void moe_route(const Config& c, int64_t N, const S* logits, MoeState<S>& st);

// The rows this rank's tokens send to each expert (st.expert_rows, [E]: under a capacity every
// expert's capacity; dropless the exact counts) and the routing behind them, as moe_forward
// computes them from h [N, C] before it moves any row: a runtime that sizes the layer's expert
// call ahead of it (pathways_train --moe-routing controller) asks for these first.
template <typename S>
void moe_expert_rows(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, MoeState<S>& st,
                     MoeScratch<S>& sc);

// out [N, C] += the MoE branch of h [N, C] (layer l of `layout`, an MoE layer).
template <typename S>
void moe_forward(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, S* out,
                 MoeState<S>& st, MoeScratch<S>& sc, const ExpertComm<S>& ep);

// dh [N, C] += d/dh of the MoE branch given dy = d/d(out) [N, C]; grads += the router's and the
// local experts' gradients; the aux losses' gradients are scaled by `loss_scale` (the micro-
// batch's grad_scale, as head_backward's).
template <typename S>
void moe_backward(const ParamLayout& layout, const S* params, S* grads, int l, const S* h, const S* dy, int64_t N,
                  S* dh, S loss_scale, MoeState<S>& st, MoeScratch<S>& sc, const ExpertComm<S>& ep);

// ---- Remote experts (ExpertsAt::kRemote) ----
// The tokens' device. moe_pack: routes h [N, C] and writes the dispatched rows to sc.sent
// (expert-major, st.expert_rows per expert, padding rows zero; the rows for experts' device p,
// st.send_rows[p] of them, are contiguous), as moe_forward does before its AllToAll.
template <typename S>
void moe_pack(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, MoeState<S>& st,
              MoeScratch<S>& sc);
// out [N, C] += the experts' outputs in st.back (the dispatched buffer's rows), as moe_forward.
template <typename S>
void moe_combine(const Config& c, int64_t N, S* out, MoeState<S>& st);
// st.dgate and `dback` [dispatched rows, C] (the rows' gradients) from dy [N, C].
template <typename S>
void moe_backward_combine(const Config& c, int64_t N, const S* dy, MoeState<S>& st, std::vector<S>& dback);
// dh [N, C] += the rows' gradients `dxback` [dispatched rows, C], then the router's backward
// from st.dgate (grads += the router's), as moe_backward ends.
template <typename S>
void moe_backward_finish(const ParamLayout& layout, const S* params, S* grads, int l, const S* h, const S* dxback,
                         int64_t N, S* dh, S loss_scale, MoeState<S>& st, MoeScratch<S>& sc);
// The experts' device (its layout's local experts). st.xe holds the rows of `sources` tokens'
// devices, source-major then expert, st.block_rows [sources * El] their counts: z [R, C] = the
// experts' outputs (R the rows), st.ye and st.ge kept for the backward.
template <typename S>
void moe_experts_forward(const ParamLayout& layout, const S* params, int l, int sources, MoeState<S>& st, S* z);
// sc.dz [R, C] (the outputs' gradients) in, sc.dxe [R, C] out; grads += the local experts'.
template <typename S>
void moe_experts_backward(const ParamLayout& layout, const S* params, S* grads, int l, int sources, MoeState<S>& st,
                          MoeScratch<S>& sc);

}  // namespace pwm::model
