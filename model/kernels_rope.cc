// Rotary embeddings (kernels.h): the cos/sin table, and the rotation of the query and key heads
// forward and backward (the transpose).
#include "model/kernels.h"

#include <cmath>

namespace pwm::model {

// ---- Rotary embeddings ------------------------------------------------------------------------

template <typename S>
void rope_table(int64_t T, int64_t D, double base, S* cs) {
  const int64_t h = D / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < h; ++i) {
      // Computed in double and rounded once (the torch peer computes the angles in float).
      const double inv = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(D));
      const double a = static_cast<double>(t) * inv;
      cs[t * D + i] = static_cast<S>(std::cos(a));
      cs[t * D + h + i] = static_cast<S>(std::sin(a));
    }
}

template <typename S>
void rope_forward(int64_t N, int64_t T, int64_t heads, int64_t D, const S* cs, S alpha,
                  const S* x, int64_t ldx, S* y) {
  const int64_t h = D / 2;
  for (int64_t n = 0; n < N; ++n) {
    const S* c = cs + (n % T) * D;
    const S* s = c + h;
    for (int64_t hd = 0; hd < heads; ++hd) {
      const S* xi = x + n * ldx + hd * D;
      S* yi = y + (n * heads + hd) * D;
      for (int64_t i = 0; i < h; ++i) {
        const S x1 = xi[i], x2 = xi[h + i];
        yi[i] = alpha * (x1 * c[i] - x2 * s[i]);
        yi[h + i] = alpha * (x1 * s[i] + x2 * c[i]);
      }
    }
  }
}

template <typename S>
void rope_backward(int64_t N, int64_t T, int64_t heads, int64_t D, const S* cs, S alpha,
                   const S* dy, S* dx, int64_t ldx) {
  const int64_t h = D / 2;
  for (int64_t n = 0; n < N; ++n) {
    const S* c = cs + (n % T) * D;
    const S* s = c + h;
    for (int64_t hd = 0; hd < heads; ++hd) {
      const S* di = dy + (n * heads + hd) * D;
      S* xo = dx + n * ldx + hd * D;
      for (int64_t i = 0; i < h; ++i) {
        const S d1 = di[i], d2 = di[h + i];
        xo[i] = alpha * (d1 * c[i] + d2 * s[i]);
        xo[h + i] = alpha * (d2 * c[i] - d1 * s[i]);
      }
    }
  }
}

#define PWM_INSTANTIATE_ROPE(S)                                                                 \
  template void rope_table<S>(int64_t, int64_t, double, S*);                                    \
  template void rope_forward<S>(int64_t, int64_t, int64_t, int64_t, const S*, S, const S*,     \
                                int64_t, S*);                                                   \
  template void rope_backward<S>(int64_t, int64_t, int64_t, int64_t, const S*, S, const S*,    \
                                 S*, int64_t);

PWM_INSTANTIATE_ROPE(float)
PWM_INSTANTIATE_ROPE(double)

}  // namespace pwm::model
