// One parallel block, forward and backward, over this tp rank's shard (transformer.h).
//
// Per block the work is four big GEMMs over all N = B*T rows and the attention core:
//   yin [N, R_in]  = h [N, C] . w_in^T        w_in = wk | wv | wq | w_gate | w_up (contiguous rows)
//   out [N, C]     = ag [N, R_out] . w_out    w_out = wo | w_down, ag = a | swiglu(gate, up)
// so the attention and MLP outputs are summed inside one GEMM and reduced once over tp.
// Multi-query attention folds the Hs local heads of a sequence into the row dimension:
// scores [T*Hs, T] = q_b [T*Hs, D] . k_b^T per sequence (rows (t, h)), in causal blocks of
// query rows that skip the keys above the diagonal.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/kernels.h"
#include "model/transformer.h"

namespace pwm::model {

namespace {

constexpr int64_t kQueryBlock = kAttentionQueryBlock;

struct Dims {
  int64_t B, T, N, C, D, Hs, Fs, R_in, R_out;
  // Column offsets inside yin / rows inside w_in, and inside ag / w_out.
  int64_t k() const { return 0; }
  int64_t v() const { return D; }
  int64_t q() const { return 2 * D; }
  int64_t gate() const { return 2 * D + Hs * D; }
  int64_t up() const { return 2 * D + Hs * D + Fs; }
  int64_t g() const { return Hs * D; }
};

// Layer l's shapes: an MoE layer's fused matrices hold the attention's rows only (Fs = 0).
Dims dims(const ParamLayout& layout, int64_t B, int l) {
  const Config& c = layout.config();
  Dims d;
  d.B = B;
  d.T = c.seq_len;
  d.N = B * c.seq_len;
  d.C = c.d_model;
  d.D = c.head_dim;
  d.Hs = layout.local_heads();
  d.Fs = layout.layer(l).moe ? 0 : layout.local_ff();
  d.R_in = layout.layer(l).rows_in;
  d.R_out = layout.layer(l).rows_out;
  return d;
}

}  // namespace

template <typename S>
void block_forward(const ParamLayout& layout, const S* params, int l, Activations<S>& act,
                   Scratch<S>& sc, const TpReduce<S>& tp_allreduce, const ExpertComm<S>& ep) {
  const Config& c = layout.config();
  const Dims d = dims(layout, act.B(), l);
  PWM_CHECK_EQ(sc.B, act.B());
  const LayerOffsets& lo = layout.layer(l);
  auto& ly = act.layer(l);
  const S* w_in = params + lo.w_in;    // [R_in, C]
  const S* w_out = params + lo.w_out;  // [R_out, C]
  const S* x = act.x(l);               // [N, C]
  S* y = act.x(l + 1);                 // [N, C]
  S* yin = ly.yin.data();              // [N, R_in]
  S* ag = ly.ag.data();                // [N, R_out]
  const S qscale = S(1) / std::sqrt(static_cast<S>(d.D));

  norm_forward(c.norm, d.N, d.C, x, params + lo.norm, ly.h.data(), ly.mean.data(),
               ly.rstd.data());
  // SwiGLU runs on each block of rows of yin as soon as the GEMM has finished it (gemm_rows),
  // while the rows are in cache, instead of a pass over the whole [N, R_in] afterwards.
  gemm_rows<S>(false, true, d.N, d.R_in, d.C, S(1), ly.h.data(), d.C, w_in, d.C, S(0), yin, d.R_in,
               [&](int64_t i0, int64_t i1) {
                 if (d.Fs == 0) return;  // an MoE layer: the experts are below
                 const S* y = yin + i0 * d.R_in;
                 swiglu_forward(i1 - i0, d.Fs, y + d.gate(), y + d.up(), d.R_in,
                                ag + i0 * d.R_out + d.g(), d.R_out);
               });
  rope_forward(d.N, d.T, d.Hs, d.D, act.rope.data(), qscale, yin + d.q(), d.R_in, ly.q.data());
  rope_forward(d.N, d.T, int64_t{1}, d.D, act.rope.data(), S(1), yin + d.k(), d.R_in,
               ly.k.data());

  const int64_t TH = d.T * d.Hs;
  for (int64_t b = 0; b < d.B; ++b) {
    const S* qb = ly.q.data() + b * TH * d.D;          // [T*Hs, D]
    const S* kb = ly.k.data() + b * d.T * d.D;         // [T, D]
    const S* vb = yin + b * d.T * d.R_in + d.v();      // [T, D], ld R_in
    S* pb = ly.p.data() + b * TH * d.T;                // [T*Hs, T]
    // Causal blocks: query rows t in [t0, t1) only need keys [0, t1).
    for (int64_t t0 = 0; t0 < d.T; t0 += kQueryBlock) {
      const int64_t t1 = std::min(d.T, t0 + kQueryBlock), rows = (t1 - t0) * d.Hs;
      gemm<S>(false, true, rows, t1, d.D, S(1), qb + t0 * d.Hs * d.D, d.D, kb, d.D, S(0),
              pb + t0 * d.Hs * d.T, d.T);
    }
    causal_softmax(d.T, d.Hs, pb);
    for (int64_t t0 = 0; t0 < d.T; t0 += kQueryBlock) {
      const int64_t t1 = std::min(d.T, t0 + kQueryBlock), rows = (t1 - t0) * d.Hs;
      gemm<S>(false, false, rows, d.D, t1, S(1), pb + t0 * d.Hs * d.T, d.T, vb, d.R_in, S(0),
              sc.o.data() + t0 * d.Hs * d.D, d.D);
    }
    for (int64_t t = 0; t < d.T; ++t)  // o [T, Hs*D] -> ag[b*T + t, :Hs*D]
      std::memcpy(ag + (b * d.T + t) * d.R_out, sc.o.data() + t * d.Hs * d.D,
                  sizeof(S) * d.Hs * d.D);
  }

  // Partial block output: attention + MLP of this shard's heads and columns, one GEMM.
  // Without tensor parallelism the residual add runs on each block of rows as the GEMM finishes
  // it; with it, after the reduction (the sum must be complete first).
  const auto residual = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0 * d.C; i < i1 * d.C; ++i) y[i] += x[i];
  };
  if (tp_allreduce) {
    gemm<S>(false, false, d.N, d.C, d.R_out, S(1), ag, d.R_out, w_out, d.C, S(0), y, d.C);
    tp_allreduce(y, static_cast<size_t>(d.N * d.C));
    residual(0, d.N);
  } else {
    gemm_rows<S>(false, false, d.N, d.C, d.R_out, S(1), ag, d.R_out, w_out, d.C, S(0), y, d.C,
                 residual);
  }
  // An MoE layer's MLP branch, added after the residual (MoE with tp > 1 is refused: ParamLayout).
  // Remote experts: only the routing and the rows to send (the caller combines their outputs).
  if (layout.layer(l).moe && ep.at == ExpertsAt::kRemote)
    moe_pack(layout, params, l, ly.h.data(), d.N, act.moe(l), sc.moe);
  else if (layout.layer(l).moe)
    moe_forward(layout, params, l, ly.h.data(), d.N, y, act.moe(l), sc.moe, ep);
}

template <typename S>
void block_backward(const ParamLayout& layout, const S* params, S* grads, int l,
                    Activations<S>& act, Scratch<S>& sc, const TpReduce<S>& tp_allreduce,
                    const ExpertComm<S>& ep) {
  const Config& c = layout.config();
  const Dims d = dims(layout, act.B(), l);
  const bool moe = layout.layer(l).moe;
  PWM_CHECK_EQ(sc.B, act.B());
  const LayerOffsets& lo = layout.layer(l);
  auto& ly = act.layer(l);
  const S* w_in = params + lo.w_in;    // [R_in, C]
  const S* w_out = params + lo.w_out;  // [R_out, C]
  S* g_in = grads + lo.w_in;           // [R_in, C]
  S* g_out = grads + lo.w_out;         // [R_out, C]
  S* dx = act.dx();                    // [N, C] in: d/dx(l+1), out: d/dx(l)
  const S* yin = ly.yin.data();        // [N, R_in]
  S* dyin = sc.dyin.data();            // [N, R_in]
  S* dag = sc.dag.data();              // [N, R_out]
  const S qscale = S(1) / std::sqrt(static_cast<S>(d.D));

  // Output projection: d(ag) = dy . w_out^T;  d(w_out) += ag^T . dy. SwiGLU's backward runs on
  // each block of rows of d(ag) as the GEMM finishes it (it reads only the MLP columns of d(ag)
  // and yin, and writes only the gate/up columns of d(yin): nothing below touches them before).
  // In bf16, dy (= dx here) is an operand of both products: rounded once (Bf16Hold).
  {
    const Bf16Hold hold_dy(dx, d.N, d.C, d.C);
    gemm_rows<S>(false, true, d.N, d.R_out, d.C, S(1), dx, d.C, w_out, d.C, S(0), dag, d.R_out,
                 [&](int64_t i0, int64_t i1) {
                   if (d.Fs == 0) return;  // an MoE layer: no dense MLP columns
                   const S* y = yin + i0 * d.R_in;
                   S* dy = dyin + i0 * d.R_in;
                   swiglu_backward(i1 - i0, d.Fs, y + d.gate(), y + d.up(), d.R_in,
                                   dag + i0 * d.R_out + d.g(), d.R_out, dy + d.gate(),
                                   dy + d.up(), d.R_in);
                 });
    gemm<S>(true, false, d.R_out, d.C, d.N, S(1), ly.ag.data(), d.R_out, dx, d.C, S(1), g_out,
            d.C);
  }

  const int64_t TH = d.T * d.Hs;
  for (int64_t b = 0; b < d.B; ++b) {
    const S* qb = ly.q.data() + b * TH * d.D;      // [T*Hs, D]
    const S* kb = ly.k.data() + b * d.T * d.D;     // [T, D]
    const S* vb = yin + b * d.T * d.R_in + d.v();  // [T, D], ld R_in
    const S* pb = ly.p.data() + b * TH * d.T;      // [T*Hs, T]
    S* dyb = dyin + b * d.T * d.R_in;              // [T, R_in]
    S* dO = sc.o.data();                           // [T*Hs, D]
    S* dS = sc.att.data();                         // [T*Hs, T]
    for (int64_t t = 0; t < d.T; ++t)
      std::memcpy(dO + t * d.Hs * d.D, dag + (b * d.T + t) * d.R_out, sizeof(S) * d.Hs * d.D);
    // dP = dO . v^T;  dv = P^T . dO;  dS = softmax'(dP);  dq = dS . k;  dk = dS^T . q, over
    // causal blocks. dv and dk sum over query blocks: the last block (all keys) initializes them,
    // the earlier ones accumulate, in a fixed order.
    for (int64_t t0 = 0; t0 < d.T; t0 += kQueryBlock) {
      const int64_t t1 = std::min(d.T, t0 + kQueryBlock), rows = (t1 - t0) * d.Hs;
      gemm<S>(false, true, rows, t1, d.D, S(1), dO + t0 * d.Hs * d.D, d.D, vb, d.R_in, S(0),
              dS + t0 * d.Hs * d.T, d.T);
    }
    causal_softmax_backward(d.T, d.Hs, pb, dS);
    const int64_t last = ((d.T - 1) / kQueryBlock) * kQueryBlock;
    for (int64_t t0 = last; t0 >= 0; t0 -= kQueryBlock) {
      const int64_t t1 = std::min(d.T, t0 + kQueryBlock), rows = (t1 - t0) * d.Hs;
      const S beta = t0 == last ? S(0) : S(1);
      const S* p_blk = pb + t0 * d.Hs * d.T;  // [rows, t1], ld T
      const S* ds_blk = dS + t0 * d.Hs * d.T;
      gemm<S>(true, false, t1, d.D, rows, S(1), p_blk, d.T, dO + t0 * d.Hs * d.D, d.D, beta,
              dyb + d.v(), d.R_in);
      gemm<S>(false, false, rows, d.D, t1, S(1), ds_blk, d.T, kb, d.D, S(0),
              sc.dq.data() + t0 * d.Hs * d.D, d.D);
      gemm<S>(true, false, t1, d.D, rows, S(1), ds_blk, d.T, qb + t0 * d.Hs * d.D, d.D, beta,
              sc.dk.data(), d.D);
    }
    rope_backward(d.T, d.T, d.Hs, d.D, act.rope.data(), qscale, sc.dq.data(), dyb + d.q(),
                  d.R_in);
    rope_backward(d.T, d.T, int64_t{1}, d.D, act.rope.data(), S(1), sc.dk.data(), dyb + d.k(),
                  d.R_in);
  }

  // Input projection. The tp reduction buffer holds d(h) [N, C] then d(wk), d(wv) [2D, C]: both
  // partial over the local heads/columns, summed in ONE tp_allreduce.
  S* red = sc.reduce.data();
  S* red_kv = red + d.N * d.C;
  // dx (= dy, the residual path) += Norm'(d(h)); d(norm scale) += ... Row by row, in row order
  // (the scale's gradient is summed over rows in that order either way).
  const auto norm_rows = [&](int64_t i0, int64_t i1) {
    norm_backward(c.norm, i1 - i0, d.C, red + i0 * d.C, act.x(l) + i0 * d.C, params + lo.norm,
                  ly.mean.data() + i0, ly.rstd.data() + i0, dx + i0 * d.C, grads + lo.norm);
  };
  // Without tensor parallelism d(h) is complete when its GEMM finishes a block of rows: the norm's
  // backward runs there, while the rows are in cache (the GEMMs below neither read nor write dx
  // or the norm's gradient). With it, after the reduction. An MoE layer adds the experts' and the
  // router's d(h) before the norm's backward (which then also runs after the product).
  // In bf16, d(yin) is an operand of all three products and h of two: each rounded once.
  {
    const Bf16Hold hold_dyin(dyin, d.N, d.R_in, d.R_in);
    const Bf16Hold hold_h(ly.h.data(), d.N, d.C, d.C);
    if (tp_allreduce || moe)
      gemm<S>(false, false, d.N, d.C, d.R_in, S(1), dyin, d.R_in, w_in, d.C, S(0), red, d.C);
    else
      gemm_rows<S>(false, false, d.N, d.C, d.R_in, S(1), dyin, d.R_in, w_in, d.C, S(0), red,
                   d.C, norm_rows);
    gemm<S>(true, false, d.R_in - d.q(), d.C, d.N, S(1), dyin + d.q(), d.R_in, ly.h.data(), d.C,
            S(1), g_in + d.q() * d.C, d.C);
    gemm<S>(true, false, 2 * d.D, d.C, d.N, S(1), dyin, d.R_in, ly.h.data(), d.C, S(0), red_kv,
            d.C);
  }
  if (moe && ep.at == ExpertsAt::kRemote)  // (the caller ran moe_backward_combine: dx is unchanged since)
    moe_backward_finish(layout, params, grads, l, ly.h.data(), act.moe(l).dxback.data(), d.N, red, act.loss_scale,
                        act.moe(l), sc.moe);
  else if (moe)
    moe_backward(layout, params, grads, l, ly.h.data(), dx, d.N, red, act.loss_scale, act.moe(l), sc.moe, ep);
  if (tp_allreduce) tp_allreduce(red, static_cast<size_t>(d.N * d.C + 2 * d.D * d.C));
  for (int64_t i = 0; i < 2 * d.D * d.C; ++i) g_in[i] += red_kv[i];
  if (tp_allreduce || moe) norm_rows(0, d.N);
}

template <typename S>
std::vector<int64_t> block_expert_rows(const ParamLayout& layout, const S* params, int l, Activations<S>& act,
                                       Scratch<S>& sc) {
  const Config& c = layout.config();
  const LayerOffsets& lo = layout.layer(l);
  auto& ly = act.layer(l);
  norm_forward(c.norm, act.N(), c.d_model, act.x(l), params + lo.norm, ly.h.data(), ly.mean.data(), ly.rstd.data());
  moe_expert_rows(layout, params, l, ly.h.data(), act.N(), act.moe(l), sc.moe);
  return act.moe(l).expert_rows;
}

#define PWM_INSTANTIATE_BLOCK(S)                                                          \
  template void block_forward<S>(const ParamLayout&, const S*, int, Activations<S>&,      \
                                 Scratch<S>&, const TpReduce<S>&, const ExpertComm<S>&);  \
  template void block_backward<S>(const ParamLayout&, const S*, S*, int, Activations<S>&, \
                                  Scratch<S>&, const TpReduce<S>&, const ExpertComm<S>&); \
  template std::vector<int64_t> block_expert_rows<S>(const ParamLayout&, const S*, int,   \
                                                     Activations<S>&, Scratch<S>&);

PWM_INSTANTIATE_BLOCK(float)
PWM_INSTANTIATE_BLOCK(double)

}  // namespace pwm::model
