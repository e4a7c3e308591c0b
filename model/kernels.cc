#include "model/kernels.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "common/env.h"
#include "common/time.h"
#include "model/gemm_avx512.h"
#include "model/gemm_bf16.h"

#ifdef PWM_HAVE_OPENBLAS
#include <cblas.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pwm::model {

namespace {

GemmBackend default_backend() {
  if (detail::sgemm_avx512_available()) return GemmBackend::kAvx512;
#ifdef PWM_HAVE_OPENBLAS
  return GemmBackend::kBlas;
#else
  return GemmBackend::kEigen;
#endif
}
std::atomic<GemmBackend> g_backend{default_backend()};
std::atomic<Precision> g_precision{Precision::kFp32};
std::once_flag g_threads_once;
std::atomic<bool> g_profiling{false};
GemmStats g_stats;  // only touched when profiling (single-threaded benchmark use)
std::map<std::string, GemmStats> g_shape_stats;  // likewise

void apply_threads(int n) {
#ifdef PWM_HAVE_OPENBLAS
  openblas_set_num_threads(n);
#endif
  Eigen::setNbThreads(n);
}

void init_threads_once() {
  std::call_once(g_threads_once, [] {
    const int64_t n = env_int("PWM_MODEL_THREADS", 1);
    if (n < 1) PWM_THROW("PWM_MODEL_THREADS must be >= 1 (got {})", n);
    apply_threads(static_cast<int>(n));
  });
}

template <typename S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename S>
using CMap = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>;
template <typename S>
using MMap = Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>>;

template <typename S>
void gemm_eigen(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const S* A,
                int64_t lda, const S* B, int64_t ldb, S beta, S* C, int64_t ldc) {
  MMap<S> c(C, M, N, Eigen::OuterStride<>(ldc));
  CMap<S> a(A, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(lda));
  CMap<S> b(B, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(ldb));
  if (beta == S(0))
    c.setZero();
  else if (beta != S(1))
    c *= beta;
  if (!ta && !tb) c.noalias() += alpha * a * b;
  if (!ta && tb) c.noalias() += alpha * a * b.transpose();
  if (ta && !tb) c.noalias() += alpha * a.transpose() * b;
  if (ta && tb) c.noalias() += alpha * a.transpose() * b.transpose();
}

#ifdef PWM_HAVE_OPENBLAS
void gemm_blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}
void gemm_blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
               int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
              static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}
#endif

}  // namespace

void set_gemm_backend(GemmBackend b) {
  if (b == GemmBackend::kBlas && !have_blas())
    PWM_THROW("gemm backend 'blas' requested but pwm_model was built without OpenBLAS");
  if (b == GemmBackend::kAvx512 && !have_avx512_gemm())
    PWM_THROW("gemm backend 'avx512' requested but pwm_model was built without AVX-512 "
              "(PORTABLE=ON); use blas or eigen");
  g_backend = b;
}
bool have_avx512_gemm() { return detail::sgemm_avx512_available(); }
GemmBackend parse_gemm_backend(const std::string& name) {
  if (name == "avx512") return GemmBackend::kAvx512;
  if (name == "blas") return GemmBackend::kBlas;
  if (name == "eigen") return GemmBackend::kEigen;
  PWM_THROW("unknown gemm backend '{}': use avx512, blas or eigen", name);
}
GemmBackend gemm_backend() { return g_backend; }
bool have_blas() {
#ifdef PWM_HAVE_OPENBLAS
  return true;
#else
  return false;
#endif
}
const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::kAvx512: return "avx512";
    case GemmBackend::kBlas: return "blas";
    default: return "eigen";
  }
}

std::string blas_info() {
#ifdef PWM_HAVE_OPENBLAS
  return std::string(openblas_get_config()) + " core=" + openblas_get_corename();
#else
  return "Eigen";
#endif
}

void set_precision(Precision p) {
  if (p == Precision::kBf16 && !detail::bf16_gemm_available())
    PWM_THROW("--precision bf16 needs oneDNN, but pwm_model was built without it: install "
              "libdnnl-dev (mpi_scripts/env.sh does) and reconfigure, or use --precision fp32");
  g_precision = p;
}
Precision precision() { return g_precision; }
Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  PWM_THROW("unknown precision '{}': use fp32 or bf16", name);
}
const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }
bool have_bf16_gemm() { return detail::bf16_gemm_available(); }
std::string bf16_info() {
  const bool avx = detail::cpu_has_avx512_bf16(), amx = detail::cpu_has_amx_bf16();
  std::string cpu;
  if (avx || amx)
    cpu = std::string("CPU bf16: ") + (avx ? "avx512_bf16" : "") + (avx && amx ? " + " : "") +
          (amx ? "amx_bf16" : "") + (amx ? "" : " (no amx_bf16)");
  else
    cpu = "CPU bf16: NONE (this CPU has no bf16 instructions; oneDNN emulates bf16 products)";
  return cpu + "; " + detail::onednn_info() +
         (detail::onednn_bf16_usable() ? ""
                                       : " (no oneDNN bf16 matmul for this ISA: bf16-rounded operands "
                                         "through the fp32 GEMM)");
}

void Bf16Hold::hold(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  if (g_precision.load(std::memory_order_relaxed) != Precision::kBf16 ||
      !detail::onednn_bf16_usable())
    return;
  detail::hold_bf16(x, rows, cols, ld);
  x_ = x;
}
Bf16Hold::~Bf16Hold() {
  if (x_) detail::release_bf16(x_);
}

void set_gemm_profiling(bool on) { g_profiling = on; }
GemmStats gemm_stats() { return g_stats; }
void reset_gemm_stats() {
  g_stats = GemmStats{};
  g_shape_stats.clear();
}
std::vector<GemmShapeStats> gemm_stats_by_shape() {
  std::vector<GemmShapeStats> v;
  for (const auto& [shape, st] : g_shape_stats) v.push_back({shape, st});
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.stats.seconds > b.stats.seconds; });
  return v;
}

void set_num_threads(int n) {
  PWM_CHECK_GE(n, 1);
  init_threads_once();
  apply_threads(n);
}

namespace {

using RowsFn = std::function<void(int64_t, int64_t)>;

// gemm and gemm_rows; rows may be null.
template <typename S>
void gemm_impl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const S* A,
               int64_t lda, const S* B, int64_t ldb, S beta, S* C, int64_t ldc,
               const RowsFn* rows) {
  init_threads_once();
  if (M == 0) return;
  // After the product, for the backends that do not interleave it: all rows at once.
  const auto all_rows = [&] {
    if (rows) (*rows)(0, M);
  };
  if (N == 0) return all_rows();
  if (g_profiling.load(std::memory_order_relaxed)) [[unlikely]] {
    // The fused pass runs after the timed product, so it counts as time outside gemm.
    g_profiling = false;
    const double t0 = now_s();
    gemm_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, static_cast<const RowsFn*>(nullptr));
    const double dt = now_s() - t0;
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    GemmStats& sh = g_shape_stats[std::string(ta ? "T" : "N") + (tb ? "T " : "N ") +
                                  std::to_string(M) + "x" + std::to_string(N) + "x" +
                                  std::to_string(K)];
    for (GemmStats* st : {&g_stats, &sh}) {
      st->seconds += dt;
      st->flops += flops;
      ++st->calls;
    }
    g_profiling = true;
    return all_rows();
  }
  if constexpr (std::is_same_v<S, float>) {
    if (g_precision.load(std::memory_order_relaxed) == Precision::kBf16) {
      if (detail::gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return all_rows();
      // No oneDNN bf16 matmul on this CPU: bf16-rounded copies of the operands (dense, in
      // their stored layout) through the fp32 GEMM below; same operands, fp32 sums.
      thread_local std::vector<float> a16, b16;
      const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
      a16.resize(static_cast<size_t>(ar * ac));
      b16.resize(static_cast<size_t>(br * bc));
      for (int64_t r = 0; r < ar; ++r) detail::round_to_bf16(A + r * lda, a16.data() + r * ac, ac);
      for (int64_t r = 0; r < br; ++r) detail::round_to_bf16(B + r * ldb, b16.data() + r * bc, bc);
      A = a16.data();
      B = b16.data();
      lda = ac;
      ldb = bc;
    }
  }
  GemmBackend b = g_backend.load(std::memory_order_relaxed);
  if (b == GemmBackend::kAvx512) {
    if constexpr (std::is_same_v<S, float>) {
      detail::sgemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, rows);
      return;
    }
    b = have_blas() ? GemmBackend::kBlas : GemmBackend::kEigen;  // doubles (tests)
  }
#ifdef PWM_HAVE_OPENBLAS
  if (b == GemmBackend::kBlas) {
    gemm_blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return all_rows();
  }
#endif
  gemm_eigen(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  all_rows();
}

}  // namespace

template <typename S>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const S* A, int64_t lda,
          const S* B, int64_t ldb, S beta, S* C, int64_t ldc) {
  gemm_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
            static_cast<const RowsFn*>(nullptr));
}

template <typename S>
void gemm_rows(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const S* A,
               int64_t lda, const S* B, int64_t ldb, S beta, S* C, int64_t ldc,
               const std::function<void(int64_t, int64_t)>& rows) {
  gemm_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, &rows);
}

// ---- Deterministic building blocks ------------------------------------------------------------
// Every result must be a function of the values only, never of a buffer's address or of where
// a loop's SIMD body ends (Eigen's vectorized reductions and exp() on a Map peel unaligned
// elements into scalar code, so they are not used here). Sums use kLanes independent
// accumulators combined in a fixed tree; exp is one branch-free formula that the compiler
// vectorizes and that gives the same bits in the SIMD body and the scalar tail
// (-ffp-contract=off, model/CMakeLists.txt).

namespace {

constexpr int kLanes = 16;

template <typename S, typename F>
S det_sum(int64_t n, F term) {
  S acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  for (int j = 0; i + j < n; ++j) acc[j] += term(i + j);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

// max is exact, so any grouping gives the same value; kLanes lanes let it vectorize.
template <typename S>
S row_max(const S* x, int64_t n) {
  S acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  for (; i < n; ++i) acc[0] = acc[0] > x[i] ? acc[0] : x[i];
  for (int j = 1; j < kLanes; ++j) acc[0] = acc[0] > acc[j] ? acc[0] : acc[j];
  return acc[0];
}

// exp(x) for float: Cephes' expf (range reduction by ln 2, degree-6 polynomial, 2^n by building
// the exponent bits), ~1 ulp, inputs clamped to [-87.3, 88] (results stay finite and normal).
inline float exp_det(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}
// Double is only used by the finite-difference tests: the library exp.
inline double exp_det(double x) { return std::exp(x); }

#if defined(__AVX512F__)
// exp_det's method on 16 lanes, with fused multiply-adds (so not exp_det's bits: SwiGLU uses this
// one only, in every lane and every tail alike). Deterministic: no table, no data-dependent path.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.0f));
  const __m512 shift = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift),
                                 shift);  // round(x / ln 2)
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);  // p * 2^n
}

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// SwiGLU on 16 lanes. GCC vectorizes the scalar loops below, but around exp_det's clamps it
// computes the reciprocal twice under masks, and their loads wait on memory (gate and up come
// cold from the forward pass). Measured with model_bench, fp32, this and the scalar loops
// alternating step by step in one process: on/off step time 0.995, 0.990, 0.987.
void swiglu_forward16(int64_t N, int64_t F, const float* gate, const float* up, int64_t ld_in,
                      float* g, int64_t ld_g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t n = 0; n < N; ++n) {
    const float* a = gate + n * ld_in;
    const float* b = up + n * ld_in;
    float* o = g + n * ld_g;
    for (int64_t i = 0; i < F; i += 16) {
      const __mmask16 m = lanes(F - i);
      const __m512 av = _mm512_maskz_loadu_ps(m, a + i), bv = _mm512_maskz_loadu_ps(m, b + i);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), av));
      _mm512_mask_storeu_ps(o + i, m, _mm512_div_ps(_mm512_mul_ps(av, bv), _mm512_add_ps(one, e)));
    }
  }
}

// Rows two ahead of gate and up are prefetched: each row is its own 4 KB stream.
void swiglu_backward16(int64_t N, int64_t F, const float* gate, const float* up, int64_t ld_in,
                       const float* dg, int64_t ld_g, float* dgate, float* dup, int64_t ld_d) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t n = 0; n < N; ++n) {
    const float* a = gate + n * ld_in;
    const float* b = up + n * ld_in;
    const float* d = dg + n * ld_g;
    float* da = dgate + n * ld_d;
    float* db = dup + n * ld_d;
    const bool ahead = n + 2 < N;
    for (int64_t i = 0; i < F; i += 16) {
      if (ahead) {
        _mm_prefetch(reinterpret_cast<const char*>(a + 2 * ld_in + i), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(b + 2 * ld_in + i), _MM_HINT_T0);
      }
      const __mmask16 m = lanes(F - i);
      const __m512 av = _mm512_maskz_loadu_ps(m, a + i), bv = _mm512_maskz_loadu_ps(m, b + i),
                   dv = _mm512_maskz_loadu_ps(m, d + i);
      const __m512 sig =
          _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), av))));
      _mm512_mask_storeu_ps(db + i, m, _mm512_mul_ps(dv, _mm512_mul_ps(av, sig)));
      // d(gate) = d * up * sig * (1 + a (1 - sig))
      const __m512 t = _mm512_mul_ps(sig, _mm512_fmadd_ps(av, _mm512_sub_ps(one, sig), one));
      _mm512_mask_storeu_ps(da + i, m, _mm512_mul_ps(_mm512_mul_ps(dv, bv), t));
    }
  }
}
#endif

}  // namespace

float exp_approx(float x) { return exp_det(x); }

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

// ---- SwiGLU -----------------------------------------------------------------------------------

template <typename S>
void swiglu_forward(int64_t N, int64_t F, const S* gate, const S* up, int64_t ld_in, S* g,
                    int64_t ld_g) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float>) return swiglu_forward16(N, F, gate, up, ld_in, g, ld_g);
#endif
  for (int64_t n = 0; n < N; ++n) {
    const S* a = gate + n * ld_in;
    const S* b = up + n * ld_in;
    S* o = g + n * ld_g;
    for (int64_t i = 0; i < F; ++i) o[i] = a[i] * b[i] / (S(1) + exp_det(-a[i]));
  }
}

template <typename S>
void swiglu_backward(int64_t N, int64_t F, const S* gate, const S* up, int64_t ld_in,
                     const S* dg, int64_t ld_g, S* dgate, S* dup, int64_t ld_d) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float>)
    return swiglu_backward16(N, F, gate, up, ld_in, dg, ld_g, dgate, dup, ld_d);
#endif
  for (int64_t n = 0; n < N; ++n) {
    const S* a = gate + n * ld_in;
    const S* b = up + n * ld_in;
    const S* d = dg + n * ld_g;
    S* da = dgate + n * ld_d;
    S* db = dup + n * ld_d;
    for (int64_t i = 0; i < F; ++i) {
      const S sig = S(1) / (S(1) + exp_det(-a[i]));
      db[i] = d[i] * (a[i] * sig);
      da[i] = d[i] * b[i] * (sig * (S(1) + a[i] * (S(1) - sig)));
    }
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

// ---- Explicit instantiations ------------------------------------------------------------------

#define PWM_INSTANTIATE_KERNELS(S)                                                              \
  template void gemm<S>(bool, bool, int64_t, int64_t, int64_t, S, const S*, int64_t, const S*, \
                        int64_t, S, S*, int64_t);                                               \
  template void gemm_rows<S>(bool, bool, int64_t, int64_t, int64_t, S, const S*, int64_t,      \
                             const S*, int64_t, S, S*, int64_t,                                 \
                             const std::function<void(int64_t, int64_t)>&);                     \
  template void norm_forward<S>(NormKind, int64_t, int64_t, const S*, const S*, S*, S*, S*);   \
  template void norm_backward<S>(NormKind, int64_t, int64_t, const S*, const S*, const S*,     \
                                 const S*, const S*, S*, S*);                                   \
  template void rope_table<S>(int64_t, int64_t, double, S*);                                    \
  template void rope_forward<S>(int64_t, int64_t, int64_t, int64_t, const S*, S, const S*,     \
                                int64_t, S*);                                                   \
  template void rope_backward<S>(int64_t, int64_t, int64_t, int64_t, const S*, S, const S*,    \
                                 S*, int64_t);                                                  \
  template void causal_softmax<S>(int64_t, int64_t, S*);                                        \
  template void causal_softmax_backward<S>(int64_t, int64_t, const S*, S*);                     \
  template void swiglu_forward<S>(int64_t, int64_t, const S*, const S*, int64_t, S*, int64_t);  \
  template void swiglu_backward<S>(int64_t, int64_t, const S*, const S*, int64_t, const S*,     \
                                   int64_t, S*, S*, int64_t);                                   \
  template double xent_forward<S>(int64_t, int64_t, const int32_t*, int64_t, int64_t, double,  \
                                  S*, S*);                                                      \
  template void xent_backward<S>(int64_t, int64_t, const int32_t*, int64_t, int64_t, double,   \
                                 const S*, const S*, S, S*);

PWM_INSTANTIATE_KERNELS(float)
PWM_INSTANTIATE_KERNELS(double)

}  // namespace pwm::model
