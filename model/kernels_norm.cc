// Normalization (kernels.h): LayerNorm without bias and RMSNorm, forward and backward.
#include "model/kernels.h"

#include <cmath>

#include "model/kernels_det.h"

namespace pwm::model {

using detail::det_sum;

// ---- Normalization ----------------------------------------------------------------------------

template <typename S>
void norm_forward(NormKind kind, int64_t N, int64_t C, const S* x, const S* g, S* h, S* mean,
                  S* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S* hr = h + n * C;
    const S m =
        kind == NormKind::kLayerNorm ? det_sum<S>(C, [&](int64_t i) { return xr[i]; }) / S(C) : S(0);
    const S var = det_sum<S>(C, [&](int64_t i) { return (xr[i] - m) * (xr[i] - m); }) / S(C);
    const S r = S(1) / std::sqrt(var + S(kNormEps));
    mean[n] = m;
    rstd[n] = r;
    for (int64_t i = 0; i < C; ++i) hr[i] = (xr[i] - m) * r * g[i];
  }
}

template <typename S>
void norm_backward(NormKind kind, int64_t N, int64_t C, const S* dh, const S* x, const S* g,
                   const S* mean, const S* rstd, S* dx, S* dg) {
  for (int64_t n = 0; n < N; ++n) {
    const S* dhr = dh + n * C;
    const S* xr = x + n * C;
    S* dxr = dx + n * C;
    const S r = rstd[n], m = mean[n];
    for (int64_t i = 0; i < C; ++i) dg[i] += dhr[i] * ((xr[i] - m) * r);
    const S mean_dxhat_xhat =
        det_sum<S>(C, [&](int64_t i) { return (dhr[i] * g[i]) * ((xr[i] - m) * r); }) / S(C);
    const S mean_dxhat =
        kind == NormKind::kLayerNorm ? det_sum<S>(C, [&](int64_t i) { return dhr[i] * g[i]; }) / S(C)
                                     : S(0);
    for (int64_t i = 0; i < C; ++i)
      dxr[i] += r * ((dhr[i] * g[i]) - mean_dxhat - ((xr[i] - m) * r) * mean_dxhat_xhat);
  }
}

#define PWM_INSTANTIATE_NORM(S)                                                                 \
  template void norm_forward<S>(NormKind, int64_t, int64_t, const S*, const S*, S*, S*, S*);   \
  template void norm_backward<S>(NormKind, int64_t, int64_t, const S*, const S*, const S*,     \
                                 const S*, const S*, S*, S*);

PWM_INSTANTIATE_NORM(float)
PWM_INSTANTIATE_NORM(double)

}  // namespace pwm::model
