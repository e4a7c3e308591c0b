// The Mixture-of-Experts branch (moe.h): router, capacity, dispatch, experts, combine, backward.
//
// Order of every sum is fixed (deterministic, no dependence on buffer addresses):
//  - the router's products run in plain loops in increasing c, its softmax in double;
//  - each expert runs one product per (source rank, expert) block of rows, in rank then expert
//    order: a row's result never depends on the other rows, and the weight gradients sum each
//    block's rows in order, blocks in order. Padding rows (zeros) sit at the end of a block, so a
//    capacity that drops nothing gives the bits of dropless (zero rows add +0 to every sum);
//  - the combine adds a token's choices in k order.
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/kernels.h"

namespace pwm::model {

void MoeStats::add(const MoeStats& o) {
  choices += o.choices;
  dropped += o.dropped;
  expert_rows += o.expert_rows;
  if (expert_tokens.size() < o.expert_tokens.size()) expert_tokens.resize(o.expert_tokens.size(), 0);
  for (size_t i = 0; i < o.expert_tokens.size(); ++i) expert_tokens[i] += o.expert_tokens[i];
  call_tokens.insert(call_tokens.end(), o.call_tokens.begin(), o.call_tokens.end());
  lb_loss += o.lb_loss;
  z_loss += o.z_loss;
}

namespace {

template <typename V>
void grow(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Softmax and log-sum-exp of one row of E logits, in double (`ex`: E doubles of scratch).
template <typename S>
void softmax_row(int64_t E, const S* logit, S* p, S* lse, double* ex) {
  double m = static_cast<double>(logit[0]);
  for (int64_t e = 1; e < E; ++e) m = std::max(m, static_cast<double>(logit[e]));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += ex[e] = std::exp(static_cast<double>(logit[e]) - m);
  for (int64_t e = 0; e < E; ++e) p[e] = static_cast<S>(ex[e] / sum);
  *lse = static_cast<S>(m + std::log(sum));
}

// The K largest of p[0..E) in descending order, ties to the lower index.
template <typename S>
void top_k(int64_t E, int64_t K, const S* p, int32_t* out) {
  for (int64_t k = 0; k < K; ++k) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken = taken || out[j] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
    }
    out[k] = best;
  }
}

struct Shape {
  int64_t C, F, E, K, El, P;
};
Shape shape_of(const ParamLayout& layout, int P) {
  const Config& c = layout.config();
  return {c.d_model, c.d_ff, c.experts, c.top_k, layout.local_experts(), P};
}

// Rows of the dispatched buffer before expert e (expert-major).
std::vector<int64_t> offsets(const std::vector<int64_t>& rows) {
  std::vector<int64_t> off(rows.size() + 1, 0);
  for (size_t i = 0; i < rows.size(); ++i) off[i + 1] = off[i] + rows[i];
  return off;
}

// Sums `per` consecutive entries: rows per rank from rows per (rank, expert).
std::vector<int64_t> per_rank(const std::vector<int64_t>& rows, int64_t per) {
  std::vector<int64_t> out(rows.size() / static_cast<size_t>(per), 0);
  for (size_t i = 0; i < rows.size(); ++i) out[i / static_cast<size_t>(per)] += rows[i];
  return out;
}

}  // namespace

template <typename S>
void moe_route(const Config& c, int64_t N, const S* logits, MoeState<S>& st) {
  const int64_t E = c.experts, K = c.top_k, cap = c.expert_capacity(N);
  st.probs.resize(static_cast<size_t>(N * E));
  st.lse.resize(static_cast<size_t>(N));
  st.choice.resize(static_cast<size_t>(N * K));
  st.gate.resize(static_cast<size_t>(N * K));
  st.slot.resize(static_cast<size_t>(N * K));
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  std::vector<double> ex(static_cast<size_t>(E));
  MoeStats& s = st.stats;
  s = MoeStats{};
  s.expert_tokens.assign(static_cast<size_t>(E), 0);
  for (int64_t n = 0; n < N; ++n) {
    S* p = st.probs.data() + n * E;
    softmax_row(E, logits + n * E, p, &st.lse[n], ex.data());
    int32_t* ch = st.choice.data() + n * K;
    top_k(E, K, p, ch);
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += static_cast<double>(p[ch[k]]);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ch[k];
      st.gate[n * K + k] = K == 1 ? p[e] : static_cast<S>(static_cast<double>(p[e]) / sum);
      ++s.expert_tokens[e];
      // Capacity in token order: the slot is the expert's row index for now (made global below).
      st.slot[n * K + k] = cap < 0 || count[e] < cap ? count[e]++ : -1;
      if (st.slot[n * K + k] < 0) ++s.dropped;
    }
  }
  s.choices = N * K;
  s.call_tokens = s.expert_tokens;
  st.expert_rows.assign(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) st.expert_rows[e] = cap < 0 ? count[e] : cap;
  const std::vector<int64_t> off = offsets(st.expert_rows);
  for (int64_t i = 0; i < N * K; ++i)
    if (st.slot[i] >= 0) st.slot[i] += off[st.choice[i]];
  // Aux losses' values: E sum_i f_i P_i and mean_n lse_n^2.
  double lb = 0, z = 0;
  for (int64_t e = 0; e < E; ++e) {
    double P = 0;
    for (int64_t n = 0; n < N; ++n) P += static_cast<double>(st.probs[n * E + e]);
    lb += static_cast<double>(s.expert_tokens[e]) / static_cast<double>(N * K) * (P / static_cast<double>(N));
  }
  for (int64_t n = 0; n < N; ++n) z += static_cast<double>(st.lse[n]) * static_cast<double>(st.lse[n]);
  s.lb_loss = static_cast<double>(E) * lb;
  s.z_loss = z / static_cast<double>(N);
}

namespace {

// logits [N, E] = h . router^T + skew, each sum in increasing c. The E sums of a token advance
// together (independent chains: the adds' latency overlaps), each in its own order.
template <typename S>
void router_logits(const Config& c, int64_t N, const S* h, const S* router, S* logits) {
  const int64_t C = c.d_model, E = c.experts;
  std::vector<S> acc(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::fill(acc.begin(), acc.end(), S(0));
    const S* hr = h + n * C;
    for (int64_t i = 0; i < C; ++i)
      for (int64_t e = 0; e < E; ++e) acc[e] += hr[i] * router[e * C + i];
    for (int64_t e = 0; e < E; ++e) {
      const double skew = E > 1 ? c.router_skew * static_cast<double>(E - 1 - e) / static_cast<double>(E - 1) : 0.0;
      logits[n * E + e] = acc[e] + static_cast<S>(skew);
    }
  }
}

// The local experts over st.xe: per (source rank, expert) block, z rows out.
template <typename S>
void experts_forward(const ParamLayout& layout, const S* params, int l, const Shape& d, MoeState<S>& st, S* z) {
  const LayerOffsets& lo = layout.layer(l);
  int64_t r0 = 0;
  for (int64_t b = 0; b < d.P * d.El; ++b) {
    const int64_t j = b % d.El, rows = st.block_rows[b];
    if (rows == 0) continue;
    const S* w_gu = params + lo.expert_gate_up + j * 2 * d.F * d.C;  // [2F, C]
    const S* w_down = params + lo.expert_down + j * d.F * d.C;       // [F, C] ([in, out])
    S* ye = st.ye.data() + r0 * 2 * d.F;
    S* ge = st.ge.data() + r0 * d.F;
    gemm<S>(false, true, rows, 2 * d.F, d.C, S(1), st.xe.data() + r0 * d.C, d.C, w_gu, d.C, S(0), ye, 2 * d.F);
    swiglu_forward(rows, d.F, ye, ye + d.F, 2 * d.F, ge, d.F);
    gemm<S>(false, false, rows, d.C, d.F, S(1), ge, d.F, w_down, d.C, S(0), z + r0 * d.C, d.C);
    r0 += rows;
  }
}

// Moves the dispatched rows to the experts' ranks (P > 1) and sets block/recv rows.
template <typename S>
void dispatch(const Config& c, const Shape& d, const S* sent, MoeState<S>& st, const ExpertComm<S>& ep) {
  st.send_rows = per_rank(st.expert_rows, d.El);
  st.block_rows.assign(static_cast<size_t>(d.P * d.El), 0);
  if (c.capacity_factor == 0.0)
    ep.counts(st.expert_rows.data(), st.block_rows.data(), d.El);  // dropless: the counts first
  else
    std::fill(st.block_rows.begin(), st.block_rows.end(), st.expert_rows[0]);
  st.recv_rows = per_rank(st.block_rows, d.El);
  int64_t R = 0;
  for (int64_t r : st.recv_rows) R += r;
  grow(st.xe, static_cast<size_t>(R * d.C));
  ep.rows(sent, st.send_rows.data(), st.xe.data(), st.recv_rows.data(), d.C);
}

}  // namespace

template <typename S>
void moe_expert_rows(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, MoeState<S>& st,
                     MoeScratch<S>& sc) {
  const Config& c = layout.config();
  const LayerOffsets& lo = layout.layer(l);
  PWM_CHECK(lo.moe, "layer {} is not a Mixture-of-Experts layer", l);
  grow(sc.logits, static_cast<size_t>(N * c.experts));
  router_logits(c, N, h, params + lo.router, sc.logits.data());
  moe_route(c, N, sc.logits.data(), st);
}

namespace {

// Routes h and writes the dispatched rows into `sent` (padding rows zero); returns their count.
template <typename S>
int64_t pack_rows(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, MoeState<S>& st,
                  MoeScratch<S>& sc, std::vector<S>& sent) {
  const int64_t C = layout.config().d_model, K = layout.config().top_k;
  moe_expert_rows(layout, params, l, h, N, st, sc);
  const int64_t rows = offsets(st.expert_rows).back();
  grow(sent, static_cast<size_t>(rows * C));
  std::fill(sent.begin(), sent.begin() + rows * C, S(0));
  for (int64_t i = 0; i < N * K; ++i)
    if (st.slot[i] >= 0) std::memcpy(sent.data() + st.slot[i] * C, h + (i / K) * C, sizeof(S) * C);
  return rows;
}

}  // namespace

template <typename S>
void moe_pack(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, MoeState<S>& st,
              MoeScratch<S>& sc) {
  pack_rows(layout, params, l, h, N, st, sc, sc.sent);
  st.send_rows = per_rank(st.expert_rows, layout.local_experts());
}

template <typename S>
void moe_combine(const Config& c, int64_t N, S* out, MoeState<S>& st) {
  // out[n] += gate_k z(slot_k), k in order.
  const int64_t C = c.d_model, K = c.top_k;
  for (int64_t i = 0; i < N * K; ++i) {
    if (st.slot[i] < 0) continue;
    const S g = st.gate[i];
    const S* zr = st.back.data() + st.slot[i] * C;
    S* o = out + (i / K) * C;
    for (int64_t k = 0; k < C; ++k) o[k] += g * zr[k];
  }
}

template <typename S>
void moe_experts_forward(const ParamLayout& layout, const S* params, int l, int sources, MoeState<S>& st, S* z) {
  const Shape d = shape_of(layout, sources);
  int64_t R = 0;
  for (int64_t r : st.block_rows) R += r;
  grow(st.ye, static_cast<size_t>(R * 2 * d.F));
  grow(st.ge, static_cast<size_t>(R * d.F));
  experts_forward(layout, params, l, d, st, z);
}

template <typename S>
void moe_forward(const ParamLayout& layout, const S* params, int l, const S* h, int64_t N, S* out,
                 MoeState<S>& st, MoeScratch<S>& sc, const ExpertComm<S>& ep) {
  const Config& c = layout.config();
  const Shape d = shape_of(layout, ep.size);
  PWM_CHECK_EQ(static_cast<int64_t>(ep.size), static_cast<int64_t>(layout.ep_size()));
  PWM_CHECK(ep.at == ExpertsAt::kHere, "moe_forward runs local experts (remote ones: moe_pack, moe_combine)");
  // Dispatch: token rows into their slots (padding rows zero). Without expert parallelism the
  // buffer is the experts' input itself.
  const int64_t rows = pack_rows(layout, params, l, h, N, st, sc, d.P > 1 ? sc.sent : st.xe);
  if (d.P > 1) {
    dispatch(c, d, sc.sent.data(), st, ep);
  } else {
    st.block_rows = st.expert_rows;
    st.send_rows = st.recv_rows = {rows};
  }
  int64_t R = 0;
  for (int64_t r : st.recv_rows) R += r;
  std::vector<S>& z = d.P > 1 ? sc.z : st.back;
  grow(z, static_cast<size_t>(R * d.C));
  moe_experts_forward(layout, params, l, static_cast<int>(d.P), st, z.data());
  if (d.P > 1) {  // the outputs go back to the tokens' ranks
    grow(st.back, static_cast<size_t>(rows * d.C));
    ep.rows(sc.z.data(), st.recv_rows.data(), st.back.data(), st.send_rows.data(), d.C);
  }
  moe_combine(c, N, out, st);
  st.stats.expert_rows = R;
}

namespace {

// Expert backward per block: dz [R, C] in, dxe [R, C] out; grads of the local experts.
template <typename S>
void experts_backward(const ParamLayout& layout, const S* params, S* grads, int l, const Shape& d,
                      MoeState<S>& st, MoeScratch<S>& sc) {
  const LayerOffsets& lo = layout.layer(l);
  int64_t r0 = 0;
  for (int64_t b = 0; b < d.P * d.El; ++b) {
    const int64_t j = b % d.El, rows = st.block_rows[b];
    if (rows == 0) continue;
    const S* w_gu = params + lo.expert_gate_up + j * 2 * d.F * d.C;
    const S* w_down = params + lo.expert_down + j * d.F * d.C;
    S* g_gu = grads + lo.expert_gate_up + j * 2 * d.F * d.C;
    S* g_down = grads + lo.expert_down + j * d.F * d.C;
    const S* dz = sc.dz.data() + r0 * d.C;
    const S* ye = st.ye.data() + r0 * 2 * d.F;
    const S* xe = st.xe.data() + r0 * d.C;
    S* dge = sc.dge.data() + r0 * d.F;
    S* dye = sc.dye.data() + r0 * 2 * d.F;
    // dge = dz . w_down^T; d(w_down) += ge^T . dz; SwiGLU'; d(w_gate_up) += dye^T . xe; dxe = dye . w_gate_up.
    gemm<S>(false, true, rows, d.F, d.C, S(1), dz, d.C, w_down, d.C, S(0), dge, d.F);
    gemm<S>(true, false, d.F, d.C, rows, S(1), st.ge.data() + r0 * d.F, d.F, dz, d.C, S(1), g_down, d.C);
    swiglu_backward(rows, d.F, ye, ye + d.F, 2 * d.F, dge, d.F, dye, dye + d.F, 2 * d.F);
    gemm<S>(true, false, 2 * d.F, d.C, rows, S(1), dye, 2 * d.F, xe, d.C, S(1), g_gu, d.C);
    gemm<S>(false, false, rows, d.C, 2 * d.F, S(1), dye, 2 * d.F, w_gu, d.C, S(0), sc.dxe.data() + r0 * d.C, d.C);
    r0 += rows;
  }
}

// d(logits) [N, E] from the gates' gradients, the load-balancing and z losses (scaled).
template <typename S>
void router_backward_logits(const Config& c, int64_t N, const MoeState<S>& st, const S* dgate, S loss_scale,
                            S* dlogits) {
  const int64_t E = c.experts, K = c.top_k;
  std::vector<double> dp(static_cast<size_t>(E)), f(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    f[e] = static_cast<double>(st.stats.expert_tokens[e]) / static_cast<double>(N * K);
  const double lb = static_cast<double>(loss_scale) * c.aux_loss * static_cast<double>(E) / static_cast<double>(N);
  const double zs = static_cast<double>(loss_scale) * c.router_z_loss * 2.0 / static_cast<double>(N);
  for (int64_t n = 0; n < N; ++n) {
    const S* p = st.probs.data() + n * E;
    const int32_t* ch = st.choice.data() + n * K;
    const S* dg = dgate + n * K;
    for (int64_t e = 0; e < E; ++e) dp[e] = lb * f[e];
    if (K == 1) {
      dp[ch[0]] += static_cast<double>(dg[0]);
    } else {  // gate_k = p_k / sum_j p_j over the chosen: d p_j = (dg_j - sum_k dg_k gate_k) / sum
      double sum = 0, dot = 0;
      for (int64_t k = 0; k < K; ++k) sum += static_cast<double>(p[ch[k]]);
      for (int64_t k = 0; k < K; ++k) dot += static_cast<double>(dg[k]) * static_cast<double>(st.gate[n * K + k]);
      for (int64_t k = 0; k < K; ++k) dp[ch[k]] += (static_cast<double>(dg[k]) - dot) / sum;
    }
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * dp[e];
    const double lse = static_cast<double>(st.lse[n]);
    for (int64_t e = 0; e < E; ++e) {
      const double pe = static_cast<double>(p[e]);
      dlogits[n * E + e] = static_cast<S>(pe * (dp[e] - pdp) + zs * lse * pe);
    }
  }
}

}  // namespace

namespace {

// The combine's backward: d gate_k = dy[n] . z(slot_k) (in double), d z(slot_k) = gate_k dy[n]
// into dback (the dispatched buffer's rows; padding rows zero).
template <typename S>
void combine_backward(const Shape& d, int64_t N, int64_t rows, MoeState<S>& st, const S* dy, std::vector<S>& dback) {
  grow(st.dgate, static_cast<size_t>(N * d.K));
  S* dgate = st.dgate.data();
  grow(dback, static_cast<size_t>(rows * d.C));
  std::fill(dback.begin(), dback.begin() + rows * d.C, S(0));
  for (int64_t i = 0; i < N * d.K; ++i) {
    dgate[i] = 0;
    if (st.slot[i] < 0) continue;
    const S* dyr = dy + (i / d.K) * d.C;
    const S* zr = st.back.data() + st.slot[i] * d.C;
    S* dzr = dback.data() + st.slot[i] * d.C;
    double dot = 0;
    for (int64_t k = 0; k < d.C; ++k) dot += static_cast<double>(dyr[k]) * static_cast<double>(zr[k]);
    dgate[i] = static_cast<S>(dot);
    const S g = st.gate[i];
    for (int64_t k = 0; k < d.C; ++k) dzr[k] = g * dyr[k];
  }
}

// The router's backward from d(logits): d router += dlogits^T h, dh += dlogits . router, in
// fixed loop orders.
template <typename S>
void router_backward(const Shape& d, int64_t N, const S* dlogits, const S* h, const S* router, S* g_router, S* dh) {
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t n = 0; n < N; ++n) {
      const S dl = dlogits[n * d.E + e];
      const S* hr = h + n * d.C;
      S* gr = g_router + e * d.C;
      for (int64_t k = 0; k < d.C; ++k) gr[k] += dl * hr[k];
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < d.E; ++e) {
      const S dl = dlogits[n * d.E + e];
      const S* wr = router + e * d.C;
      S* dhr = dh + n * d.C;
      for (int64_t k = 0; k < d.C; ++k) dhr[k] += dl * wr[k];
    }
}

}  // namespace

template <typename S>
void moe_backward_combine(const Config& c, int64_t N, const S* dy, MoeState<S>& st, std::vector<S>& dback) {
  const Shape d{c.d_model, c.d_ff, c.experts, c.top_k, 0, 0};
  combine_backward(d, N, offsets(st.expert_rows).back(), st, dy, dback);
}

template <typename S>
void moe_experts_backward(const ParamLayout& layout, const S* params, S* grads, int l, int sources, MoeState<S>& st,
                          MoeScratch<S>& sc) {
  const Shape d = shape_of(layout, sources);
  int64_t R = 0;
  for (int64_t r : st.block_rows) R += r;
  grow(sc.dz, static_cast<size_t>(R * d.C));
  grow(sc.dge, static_cast<size_t>(R * d.F));
  grow(sc.dye, static_cast<size_t>(R * 2 * d.F));
  grow(sc.dxe, static_cast<size_t>(R * d.C));
  experts_backward(layout, params, grads, l, d, st, sc);
}

template <typename S>
void moe_backward_finish(const ParamLayout& layout, const S* params, S* grads, int l, const S* h, const S* dxback,
                         int64_t N, S* dh, S loss_scale, MoeState<S>& st, MoeScratch<S>& sc) {
  const Config& c = layout.config();
  const LayerOffsets& lo = layout.layer(l);
  const Shape d = shape_of(layout, layout.ep_size());
  // dh[n] += dx(slot_k), k in order.
  for (int64_t i = 0; i < N * d.K; ++i) {
    if (st.slot[i] < 0) continue;
    const S* src = dxback + st.slot[i] * d.C;
    S* dst = dh + (i / d.K) * d.C;
    for (int64_t k = 0; k < d.C; ++k) dst[k] += src[k];
  }
  grow(sc.dlogits, static_cast<size_t>(N * d.E));
  router_backward_logits(c, N, st, st.dgate.data(), loss_scale, sc.dlogits.data());
  router_backward(d, N, sc.dlogits.data(), h, params + lo.router, grads + lo.router, dh);
}

template <typename S>
void moe_backward(const ParamLayout& layout, const S* params, S* grads, int l, const S* h, const S* dy, int64_t N,
                  S* dh, S loss_scale, MoeState<S>& st, MoeScratch<S>& sc, const ExpertComm<S>& ep) {
  const Shape d = shape_of(layout, ep.size);
  PWM_CHECK(ep.at == ExpertsAt::kHere, "moe_backward runs local experts (remote ones: moe_backward_combine, _finish)");
  const int64_t rows = offsets(st.expert_rows).back();
  int64_t R = 0;
  for (int64_t r : st.recv_rows) R += r;
  // Without expert parallelism the dispatched rows are the experts' rows: one buffer.
  combine_backward(d, N, rows, st, dy, d.P > 1 ? sc.dback : sc.dz);
  grow(sc.dz, static_cast<size_t>(R * d.C));
  if (d.P > 1) ep.rows(sc.dback.data(), st.send_rows.data(), sc.dz.data(), st.recv_rows.data(), d.C);
  moe_experts_backward(layout, params, grads, l, static_cast<int>(d.P), st, sc);
  std::vector<S>& dxback = d.P > 1 ? sc.dxback : sc.dxe;
  if (d.P > 1) {
    grow(sc.dxback, static_cast<size_t>(rows * d.C));
    ep.rows(sc.dxe.data(), st.recv_rows.data(), sc.dxback.data(), st.send_rows.data(), d.C);
  }
  moe_backward_finish(layout, params, grads, l, h, dxback.data(), N, dh, loss_scale, st, sc);
}

#define PWM_INSTANTIATE_MOE(S)                                                                          \
  template struct MoeState<S>;                                                                          \
  template struct MoeScratch<S>;                                                                        \
  template void moe_route<S>(const Config&, int64_t, const S*, MoeState<S>&);                           \
  template void moe_expert_rows<S>(const ParamLayout&, const S*, int, const S*, int64_t, MoeState<S>&,   \
                                   MoeScratch<S>&);                                                     \
  template void moe_forward<S>(const ParamLayout&, const S*, int, const S*, int64_t, S*, MoeState<S>&,  \
                               MoeScratch<S>&, const ExpertComm<S>&);                                   \
  template void moe_backward<S>(const ParamLayout&, const S*, S*, int, const S*, const S*, int64_t, S*, \
                                S, MoeState<S>&, MoeScratch<S>&, const ExpertComm<S>&);                 \
  template void moe_pack<S>(const ParamLayout&, const S*, int, const S*, int64_t, MoeState<S>&, MoeScratch<S>&); \
  template void moe_combine<S>(const Config&, int64_t, S*, MoeState<S>&);                                 \
  template void moe_backward_combine<S>(const Config&, int64_t, const S*, MoeState<S>&, std::vector<S>&); \
  template void moe_backward_finish<S>(const ParamLayout&, const S*, S*, int, const S*, const S*, int64_t, S*, S, \
                                       MoeState<S>&, MoeScratch<S>&);                                     \
  template void moe_experts_forward<S>(const ParamLayout&, const S*, int, int, MoeState<S>&, S*);         \
  template void moe_experts_backward<S>(const ParamLayout&, const S*, S*, int, int, MoeState<S>&, MoeScratch<S>&);

PWM_INSTANTIATE_MOE(float)
PWM_INSTANTIATE_MOE(double)

}  // namespace pwm::model
