// Activations, the embedding and head pieces, and their composition. Blocks are in
// transformer_block.cc.
#include "model/transformer.h"

#include <cstring>

#include "common/check.h"
#include "model/kernels.h"

namespace pwm::model {

template <typename S>
Activations<S>::Activations(const ParamLayout& layout, int64_t B, int layer_begin, int layer_end)
    : B_(B), T_(layout.config().seq_len), C_(layout.config().d_model), D_(layout.config().head_dim),
      Hs_(layout.local_heads()), Rin_(layout.w_in_rows()), Rout_(layout.w_out_rows()) {
  const Config& c = layout.config();
  const int L = static_cast<int>(c.n_layers);
  if (layer_end < 0) layer_end = L;
  PWM_CHECK(B > 0, "micro-batch size must be positive (got {})", B);
  PWM_CHECK(0 <= layer_begin && layer_begin <= layer_end && layer_end <= L,
            "layer range [{}, {}) outside [0, {}]", layer_begin, layer_end, L);
  l0_ = layer_begin;
  l1_ = layer_end;
  const int64_t N = B * T_, C = C_, D = c.head_dim;
  xs_ = LazyArray<S>(static_cast<size_t>((l1_ - l0_ + 1) * N * C));
  dx_.assign(static_cast<size_t>(N * C), S(0));
  layers_.resize(static_cast<size_t>(l1_ - l0_));
  moe_.resize(static_cast<size_t>(l1_ - l0_));
  moe_ptr_.resize(moe_.size());
  x_ptr_.resize(static_cast<size_t>(l1_ - l0_ + 1));
  arena_ = LazyArray<S>(static_cast<size_t>((l1_ - l0_) * layer_elements(layout, B)));
  unbind_all();
  f_mean.assign(N, S(0));
  f_rstd.assign(N, S(0));
  hf.assign(N * C, S(0));
  probs.assign(N * c.vocab, S(0));
  lse.assign(N, S(0));
  rope.assign(T_ * D, S(0));
  rope_table(T_, D, c.rope_base, rope.data());
}

template <typename S>
S* Activations<S>::x(int l) {
  PWM_CHECK(l >= l0_ && l <= l1_, "x({}) outside this state's range [{}, {}]", l, l0_, l1_);
  return x_ptr_[static_cast<size_t>(l - l0_)];
}
template <typename S>
void Activations<S>::unbind_all() {
  const size_t NC = static_cast<size_t>(N() * C_);
  dx_ptr_ = dx_.data();
  for (int l = l0_; l <= l1_; ++l) x_ptr_[static_cast<size_t>(l - l0_)] = xs_.data() + static_cast<size_t>(l - l0_) * NC;
  const size_t per_layer = arena_.size() / std::max<size_t>(layers_.size(), 1);
  for (int l = l0_; l < l1_; ++l) bind_layer(l, arena_.data() + static_cast<size_t>(l - l0_) * per_layer);
  for (size_t i = 0; i < moe_.size(); ++i) moe_ptr_[i] = &moe_[i];
}

template <typename S>
void Activations<S>::bind_x(int l, S* memory) {
  PWM_CHECK(l >= l0_ && l <= l1_, "x({}) outside this state's range [{}, {}]", l, l0_, l1_);
  x_ptr_[static_cast<size_t>(l - l0_)] = memory;
}
template <typename S>
int64_t Activations<S>::layer_elements(const ParamLayout& layout, int64_t B) {
  const Config& c = layout.config();
  const int64_t T = c.seq_len, N = B * T, C = c.d_model, D = c.head_dim, Hs = layout.local_heads();
  return 2 * N + N * C + N * layout.w_in_rows() + N * Hs * D + N * D + B * T * Hs * T + N * layout.w_out_rows();
}
template <typename S>
void Activations<S>::bind_layer(int l, S* m) {
  const int64_t T = T_, N = B_ * T, C = C_, D = D_, Hs = Hs_;
  Layer& ly = layer(l);
  auto take = [&m](View<S>& v, int64_t n) {
    v.ptr = m;
    v.n = static_cast<size_t>(n);
    m += n;
  };
  take(ly.mean, N);
  take(ly.rstd, N);
  take(ly.h, N * C);
  take(ly.yin, N * Rin_);
  take(ly.q, N * Hs * D);
  take(ly.k, N * D);
  take(ly.p, B_ * T * Hs * T);
  take(ly.ag, N * Rout_);
}
template <typename S>
const S* Activations<S>::x(int l) const {
  return const_cast<Activations<S>*>(this)->x(l);
}
template <typename S>
typename Activations<S>::Layer& Activations<S>::layer(int l) {
  PWM_CHECK(l >= l0_ && l < l1_, "layer {} outside this state's range [{}, {})", l, l0_, l1_);
  return layers_[static_cast<size_t>(l - l0_)];
}
template <typename S>
const typename Activations<S>::Layer& Activations<S>::layer(int l) const {
  return const_cast<Activations<S>*>(this)->layer(l);
}

template <typename S>
MoeState<S>& Activations<S>::moe(int l) {
  PWM_CHECK(l >= l0_ && l < l1_, "layer {} outside this state's range [{}, {})", l, l0_, l1_);
  return *moe_ptr_[static_cast<size_t>(l - l0_)];
}
template <typename S>
const MoeState<S>& Activations<S>::moe(int l) const {
  return const_cast<Activations<S>*>(this)->moe(l);
}
template <typename S>
void Activations<S>::bind_moe(int l, MoeState<S>* state) {
  PWM_CHECK(l >= l0_ && l < l1_ && state, "layer {} outside this state's range [{}, {})", l, l0_, l1_);
  moe_ptr_[static_cast<size_t>(l - l0_)] = state;
}
template <typename S>
MoeStats Activations<S>::moe_stats() const {
  MoeStats s;
  for (const MoeState<S>* m : moe_ptr_) s.add(m->stats);
  return s;
}

template <typename S>
Scratch<S>::Scratch(const ParamLayout& layout, int64_t B_) : B(B_) {
  const Config& c = layout.config();
  const int64_t T = c.seq_len, N = B * T, C = c.d_model, D = c.head_dim,
                Hs = layout.local_heads();
  dyin.assign(N * layout.w_in_rows(), S(0));
  dag.assign(N * layout.w_out_rows(), S(0));
  reduce.assign(N * C + 2 * D * C, S(0));
  att.assign(T * Hs * T, S(0));
  o.assign(T * Hs * D, S(0));
  dq.assign(T * Hs * D, S(0));
  dk.assign(T * D, S(0));
  dlogits.assign(N * c.vocab, S(0));
  dhf.assign(N * C, S(0));
}

template <typename S>
void embed_forward(const ParamLayout& layout, const S* params, const int32_t* tokens,
                   Activations<S>& act) {
  const Config& c = layout.config();
  const int64_t T = c.seq_len, C = c.d_model, V = c.vocab;
  const S* E = params + layout.embed_offset();  // [V, C]
  S* x = act.x(0);                              // [N, C]
  for (int64_t b = 0; b < act.B(); ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t tok = tokens[b * (T + 1) + t];
      PWM_CHECK(tok >= 0 && tok < V, "input token {} out of range [0, {})", tok, V);
      std::memcpy(x + (b * T + t) * C, E + tok * C, sizeof(S) * C);
    }
}

template <typename S>
void embed_backward(const ParamLayout& layout, S* grads, const int32_t* tokens,
                    const Activations<S>& act) {
  const Config& c = layout.config();
  const int64_t T = c.seq_len, C = c.d_model;
  S* dE = grads + layout.embed_offset();  // [V, C]
  const S* dx = act.dx();                 // [N, C]
  for (int64_t b = 0; b < act.B(); ++b)
    for (int64_t t = 0; t < T; ++t) {
      S* row = dE + tokens[b * (T + 1) + t] * C;
      const S* d = dx + (b * T + t) * C;
      for (int64_t i = 0; i < C; ++i) row[i] += d[i];
    }
}

template <typename S>
S head_forward(const ParamLayout& layout, const S* params, const int32_t* tokens,
               Activations<S>& act) {
  const Config& c = layout.config();
  const int64_t T = c.seq_len, C = c.d_model, V = c.vocab, N = act.N();
  const int L = static_cast<int>(c.n_layers);
  const S* E = params + layout.embed_offset();  // [V, C]
  norm_forward(c.norm, N, C, act.x(L), params + layout.final_norm_offset(), act.hf.data(),
               act.f_mean.data(), act.f_rstd.data());
  // logits [N, V] = hf [N, C] . E^T
  gemm<S>(false, true, N, V, C, S(1), act.hf.data(), C, E, C, S(0), act.probs.data(), V);
  const double total = xent_forward(N, V, tokens + 1, T + 1, T, c.z_loss, act.probs.data(),
                                    act.lse.data());
  return static_cast<S>(total / static_cast<double>(N));
}

template <typename S>
void head_backward(const ParamLayout& layout, const S* params, S* grads, const int32_t* tokens,
                   S grad_scale, Activations<S>& act, Scratch<S>& sc) {
  head_backward(layout, params, HeadGrads<S>{grads + layout.embed_offset(), grads + layout.final_norm_offset()},
                tokens, grad_scale, act, sc);
}

template <typename S>
void head_backward(const ParamLayout& layout, const S* params, HeadGrads<S> grads, const int32_t* tokens,
                   S grad_scale, Activations<S>& act, Scratch<S>& sc) {
  const Config& c = layout.config();
  const int64_t T = c.seq_len, C = c.d_model, V = c.vocab, N = act.N();
  const int L = static_cast<int>(c.n_layers);
  PWM_CHECK_EQ(sc.B, act.B());
  act.loss_scale = grad_scale;
  const S* E = params + layout.embed_offset();
  xent_backward(N, V, tokens + 1, T + 1, T, c.z_loss, act.probs.data(), act.lse.data(),
                static_cast<S>(grad_scale / static_cast<S>(N)), sc.dlogits.data());
  // dE [V, C] += dlogits^T [V, N] . hf [N, C];  dhf [N, C] = dlogits [N, V] . E [V, C]
  gemm<S>(true, false, V, C, N, S(1), sc.dlogits.data(), V, act.hf.data(), C, S(1), grads.embed, C);
  gemm<S>(false, false, N, C, V, S(1), sc.dlogits.data(), V, E, C, S(0), sc.dhf.data(), C);
  std::fill(act.dx(), act.dx() + N * C, S(0));
  norm_backward(c.norm, N, C, sc.dhf.data(), act.x(L), params + layout.final_norm_offset(),
                act.f_mean.data(), act.f_rstd.data(), act.dx(), grads.final_norm);
}

template <typename S>
S forward_backward(const ParamLayout& layout, const S* params, S* grads, const int32_t* tokens,
                   int64_t B, S grad_scale, Workspace<S>& ws, const TpReduce<S>& tp_allreduce,
                   const ExpertComm<S>& ep) {
  PWM_CHECK_EQ(ws.act.B(), B);
  const int L = static_cast<int>(layout.config().n_layers);
  embed_forward(layout, params, tokens, ws.act);
  for (int l = 0; l < L; ++l) block_forward(layout, params, l, ws.act, ws.scratch, tp_allreduce, ep);
  const S loss = head_forward(layout, params, tokens, ws.act);
  head_backward(layout, params, grads, tokens, grad_scale, ws.act, ws.scratch);
  for (int l = L - 1; l >= 0; --l)
    block_backward(layout, params, grads, l, ws.act, ws.scratch, tp_allreduce, ep);
  embed_backward(layout, grads, tokens, ws.act);
  return loss;
}

template <typename S>
S forward_loss(const ParamLayout& layout, const S* params, const int32_t* tokens, int64_t B,
               Workspace<S>& ws, const TpReduce<S>& tp_allreduce, const ExpertComm<S>& ep) {
  PWM_CHECK_EQ(ws.act.B(), B);
  const int L = static_cast<int>(layout.config().n_layers);
  embed_forward(layout, params, tokens, ws.act);
  for (int l = 0; l < L; ++l) block_forward(layout, params, l, ws.act, ws.scratch, tp_allreduce, ep);
  return head_forward(layout, params, tokens, ws.act);
}

#define PWM_INSTANTIATE_MODEL(S)                                                                \
  template class Activations<S>;                                                                \
  template class Scratch<S>;                                                                    \
  template void embed_forward<S>(const ParamLayout&, const S*, const int32_t*, Activations<S>&); \
  template void embed_backward<S>(const ParamLayout&, S*, const int32_t*, const Activations<S>&); \
  template S head_forward<S>(const ParamLayout&, const S*, const int32_t*, Activations<S>&);    \
  template void head_backward<S>(const ParamLayout&, const S*, S*, const int32_t*, S,           \
                                 Activations<S>&, Scratch<S>&);                                 \
  template void head_backward<S>(const ParamLayout&, const S*, HeadGrads<S>, const int32_t*, S, \
                                 Activations<S>&, Scratch<S>&);                                 \
  template S forward_backward<S>(const ParamLayout&, const S*, S*, const int32_t*, int64_t, S,  \
                                 Workspace<S>&, const TpReduce<S>&, const ExpertComm<S>&);      \
  template S forward_loss<S>(const ParamLayout&, const S*, const int32_t*, int64_t,             \
                             Workspace<S>&, const TpReduce<S>&, const ExpertComm<S>&);

PWM_INSTANTIATE_MODEL(float)
PWM_INSTANTIATE_MODEL(double)

}  // namespace pwm::model
