// Matrix products (kernels.h): the backend (our AVX-512 SGEMM, OpenBLAS, Eigen) and the precision
// of gemm<float> (fp32, or bf16 operands through oneDNN), both process-wide; BLAS/Eigen threads;
// the optional per-shape profile; and gemm/gemm_rows, which pick among them per call.
#include "model/kernels.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
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

// ---- Explicit instantiations ------------------------------------------------------------------

#define PWM_INSTANTIATE_GEMM(S)                                                                 \
  template void gemm<S>(bool, bool, int64_t, int64_t, int64_t, S, const S*, int64_t, const S*, \
                        int64_t, S, S*, int64_t);                                               \
  template void gemm_rows<S>(bool, bool, int64_t, int64_t, int64_t, S, const S*, int64_t,      \
                             const S*, int64_t, S, S*, int64_t,                                 \
                             const std::function<void(int64_t, int64_t)>&);

PWM_INSTANTIATE_GEMM(float)
PWM_INSTANTIATE_GEMM(double)

}  // namespace pwm::model
