// The two row softmaxes (kernels.h): the attention's causal softmax of the scores and the loss's
// softmax cross-entropy over the vocabulary (with a z-loss), forward and backward; and exp_approx,
// their exp, exposed for tests. In one file because both call row_max: with two callers in the
// file the compiler keeps it out of line, as it did before the kernels were split by family, so
// the machine code is what it was (one caller per file inlines it: other instructions).
#include "model/kernels.h"

#include <cmath>

#include "common/check.h"
#include "model/kernels_det.h"

namespace pwm::model {

using detail::det_sum;
using detail::exp_det;
using detail::row_max;

float exp_approx(float x) { return exp_det(x); }

// ---- Attention softmax ------------------------------------------------------------------------

template <typename S>
void causal_softmax(int64_t T, int64_t heads, S* s) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hd = 0; hd < heads; ++hd) {
      S* row = s + (t * heads + hd) * T;
      const int64_t n = t + 1;
      const S m = row_max(row, n);
      for (int64_t i = 0; i < n; ++i) row[i] = exp_det(row[i] - m);
      const S inv = S(1) / det_sum<S>(n, [&](int64_t i) { return row[i]; });
      for (int64_t i = 0; i < n; ++i) row[i] *= inv;
      for (int64_t j = n; j < T; ++j) row[j] = S(0);
    }
}

template <typename S>
void causal_softmax_backward(int64_t T, int64_t heads, const S* p, S* dp) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hd = 0; hd < heads; ++hd) {
      const S* pr = p + (t * heads + hd) * T;
      S* dr = dp + (t * heads + hd) * T;
      const int64_t n = t + 1;
      const S dot = det_sum<S>(n, [&](int64_t i) { return pr[i] * dr[i]; });
      for (int64_t i = 0; i < n; ++i) dr[i] = pr[i] * (dr[i] - dot);
      for (int64_t j = n; j < T; ++j) dr[j] = S(0);
    }
}

// ---- Loss -------------------------------------------------------------------------------------

template <typename S>
double xent_forward(int64_t N, int64_t V, const int32_t* targets, int64_t stride, int64_t T,
                    double z_loss, S* logits, S* lse) {
  double total = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    S* r = logits + n * V;
    const int32_t y = targets[(n / T) * stride + n % T];
    PWM_CHECK(y >= 0 && y < V, "target token {} out of range [0, {})", y, V);
    const S target_logit = r[y];
    const S m = row_max(r, V);
    for (int64_t i = 0; i < V; ++i) r[i] = exp_det(r[i] - m);
    const S z = det_sum<S>(V, [&](int64_t i) { return r[i]; });
    const S l = m + std::log(z);
    const S inv = S(1) / z;
    for (int64_t i = 0; i < V; ++i) r[i] *= inv;
    lse[n] = l;
    total += static_cast<double>(l - target_logit) + z_loss * static_cast<double>(l) * l;
  }
  return total;
}

template <typename S>
void xent_backward(int64_t N, int64_t V, const int32_t* targets, int64_t stride, int64_t T,
                   double z_loss, const S* probs, const S* lse, S seed, S* dlogits) {
  for (int64_t n = 0; n < N; ++n) {
    const S* p = probs + n * V;
    S* d = dlogits + n * V;
    const S f = seed * (S(1) + S(2 * z_loss) * lse[n]);
    for (int64_t i = 0; i < V; ++i) d[i] = p[i] * f;
    d[targets[(n / T) * stride + n % T]] -= seed;
  }
}

#define PWM_INSTANTIATE_SOFTMAX(S)                                                              \
  template void causal_softmax<S>(int64_t, int64_t, S*);                                        \
  template void causal_softmax_backward<S>(int64_t, int64_t, const S*, S*);                     \
  template double xent_forward<S>(int64_t, int64_t, const int32_t*, int64_t, int64_t, double,  \
                                  S*, S*);                                                      \
  template void xent_backward<S>(int64_t, int64_t, const int32_t*, int64_t, int64_t, double,   \
                                 const S*, const S*, S, S*);

PWM_INSTANTIATE_SOFTMAX(float)
PWM_INSTANTIATE_SOFTMAX(double)

}  // namespace pwm::model
