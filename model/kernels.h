// Numeric kernels of the Transformer, templated on the scalar type S (float for training,
// double for the finite-difference tests). All matrices are row-major with an explicit leading
// dimension (elements between consecutive rows). Every kernel is single-threaded and
// deterministic: the same inputs give the same bits. Shapes use the glossary of model/config.h;
// N = B*T rows.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "model/config.h"

namespace pwm::model {

// ---- Matrix products -------------------------------------------------------------------------

// kAvx512: our own AVX-512 SGEMM (gemm_avx512.cc) for float, BLAS (else Eigen) for double.
// kBlas: OpenBLAS cblas_?gemm. kEigen: Eigen's GEMM. Default: the first available of kAvx512,
// kBlas, kEigen. Process-wide.
enum class GemmBackend { kAvx512, kBlas, kEigen };
void set_gemm_backend(GemmBackend b);
GemmBackend gemm_backend();
bool have_blas();
bool have_avx512_gemm();
GemmBackend parse_gemm_backend(const std::string& name);  // "avx512" | "blas" | "eigen"; throws
const char* gemm_backend_name(GemmBackend b);
// "OpenBLAS <config> core=<kernel set>" or "Eigen" (the kernel set follows OPENBLAS_CORETYPE).
std::string blas_info();

// Precision of gemm<float>: kFp32 (default) or kBf16 = operands rounded to bf16, products summed
// in fp32 into the fp32 C, through oneDNN's matmul (gemm_bf16.h; oneDNN picks AMX, AVX512-BF16
// or a fallback at run time). Everything else (norms, softmax, loss, AdamW) stays fp32. gemm<double>
// ignores it. Process-wide, like the backend; set once from --precision before training.
enum class Precision { kFp32, kBf16 };
void set_precision(Precision p);  // throws if kBf16 and pwm_model was built without oneDNN
Precision precision();
Precision parse_precision(const std::string& name);  // "fp32" | "bf16"; throws otherwise
const char* precision_name(Precision p);
bool have_bf16_gemm();
// One line for benchmark output: the CPU's bf16 instructions and what oneDNN dispatches to, e.g.
// "CPU bf16: avx512_bf16 (no amx_bf16); oneDNN 2.6.3, isa avx512_core_bf16" or
// "CPU bf16: NONE (oneDNN emulates bf16 products with fp32 FMAs); oneDNN 2.6.3, isa avx512_core".
std::string bf16_info();
// Holds a matrix in bf16 for the products that read it while this guard lives: with precision
// kBf16, gemm<float> rounds an operand lying inside the matrix [rows, cols] at x (leading
// dimension ld; any sub-block, either op) once, on first use, instead of on every call. The
// caller must not write the matrix while it is held. Guards nest (released in reverse order) and
// belong to the calling thread. Otherwise (kFp32, or S = double, or no oneDNN bf16 matmul) it
// does nothing. The bf16 operand values are the same either way, but a held sub-block reaches
// oneDNN as a strided operand, which can make it pick another kernel (jit gemm instead of
// brgemm) that orders the sums differently: other bits, as deterministic. Callers that must agree
// bitwise (the trainers) hold the same operands.
class Bf16Hold {
 public:
  template <typename S>
  Bf16Hold(const S* x, int64_t rows, int64_t cols, int64_t ld) {
    if constexpr (std::is_same_v<S, float>) hold(x, rows, cols, ld);
  }
  ~Bf16Hold();
  Bf16Hold(const Bf16Hold&) = delete;
  Bf16Hold& operator=(const Bf16Hold&) = delete;

 private:
  void hold(const float* x, int64_t rows, int64_t cols, int64_t ld);
  const float* x_ = nullptr;
};
// Threads used by BLAS (and Eigen). The first gemm call sets it from PWM_MODEL_THREADS
// (default 1, one thread per MPI rank); calling this afterwards overrides it.
void set_num_threads(int n);

// Optional accounting of every gemm call (for model_bench --profile): off by default, and only
// meaningful while one thread calls gemm (the counters are not synchronized).
struct GemmStats {
  int64_t calls = 0;
  double flops = 0;    // 2*M*N*K summed
  double seconds = 0;  // wall time inside gemm
};
void set_gemm_profiling(bool on);
GemmStats gemm_stats();  // totals since the last reset
void reset_gemm_stats();
// The same totals split by call shape, e.g. "NT 2048x768x256" (op letters: T = transposed),
// most time first.
struct GemmShapeStats {
  std::string shape;
  GemmStats stats;
};
std::vector<GemmShapeStats> gemm_stats_by_shape();

// C[M,N] = alpha * op(A) * op(B) + beta * C. op(A) is [M,K] (A stored [K,M] when trans_a),
// op(B) is [K,N] (B stored [N,K] when trans_b). beta == 0 ignores C's previous contents.
template <typename S>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, S alpha, const S* A,
          int64_t lda, const S* B, int64_t ldb, S beta, S* C, int64_t ldc);
// gemm, then rows(i0, i1) over row ranges of C that are increasing, disjoint and cover [0, M),
// each called once those rows of C are final. The AVX-512 backend calls it after each block of
// rows, while they are still in cache (an elementwise pass fused behind the product); the other
// backends once, with [0, M), after the product. rows must only depend on rows [i0, i1) of C
// (and on data the product does not write): then the results are the same bits either way.
template <typename S>
void gemm_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, S alpha, const S* A,
               int64_t lda, const S* B, int64_t ldb, S beta, S* C, int64_t ldc,
               const std::function<void(int64_t, int64_t)>& rows);

// ---- Normalization (shared pre-norm and final norm) -------------------------------------------

constexpr double kNormEps = 1e-5;  // both kinds, as torch.nn.functional.layer_norm's default

// h[n,:] = normalize(x[n,:]) * scale. LayerNorm (no bias): (x - mean) * rstd; RMSNorm: x * rstd.
// x, h: [N, C]; scale: [C]; mean, rstd: [N] saved for the backward (mean = 0 for RMSNorm).
template <typename S>
void norm_forward(NormKind kind, int64_t N, int64_t C, const S* x, const S* scale, S* h, S* mean,
                  S* rstd);
// dx += d(h)/d(x)^T dh;  dscale += sum_n dh * xhat.  dh, x, dx: [N, C].
template <typename S>
void norm_backward(NormKind kind, int64_t N, int64_t C, const S* dh, const S* x, const S* scale,
                   const S* mean, const S* rstd, S* dx, S* dscale);

// ---- Rotary embeddings (rotate-half convention, as the torch peer) ---------------------------
// For position t and i < D/2, angle = t * base^(-2i/D):
//   y[i] = x[i] cos - x[i+D/2] sin,   y[i+D/2] = x[i] sin + x[i+D/2] cos.
// cos_sin: [T, D] table, cos in [:, :D/2], sin in [:, D/2:].
template <typename S>
void rope_table(int64_t T, int64_t D, double base, S* cos_sin);
// For each n in [0, N), t = n % T, and each of `heads` vectors of length D:
// y[n, h*D : (h+1)*D] = alpha * rope(x[n, h*D : ...]) (y rows of length heads*D, contiguous).
template <typename S>
void rope_forward(int64_t N, int64_t T, int64_t heads, int64_t D, const S* cos_sin, S alpha,
                  const S* x, int64_t ldx, S* y);
// The transpose (inverse rotation): dx[n, h*D...] = alpha * rope^T(dy[n, h*D...]); dx has ldx.
template <typename S>
void rope_backward(int64_t N, int64_t T, int64_t heads, int64_t D, const S* cos_sin, S alpha,
                   const S* dy, S* dx, int64_t ldx);

// ---- Attention softmax ------------------------------------------------------------------------
// s: [T * heads, T] scores of one sequence, rows (t, h) (row t*heads + h). In place: causal
// softmax over columns 0..t, zeros in columns > t.
template <typename S>
void causal_softmax(int64_t T, int64_t heads, S* s);
// ds = p * (dp - sum_j dp*p) over the causal columns, in place in dp (zeros above the diagonal).
template <typename S>
void causal_softmax_backward(int64_t T, int64_t heads, const S* p, S* dp);

// ---- SwiGLU -----------------------------------------------------------------------------------
// g[n, :] = silu(gate[n, :]) * up[n, :], rows of length F, each operand with its own ld.
template <typename S>
void swiglu_forward(int64_t N, int64_t F, const S* gate, const S* up, int64_t ld_in, S* g,
                    int64_t ld_g);
// dgate = dg * up * silu'(gate), dup = dg * silu(gate) (written, not accumulated).
template <typename S>
void swiglu_backward(int64_t N, int64_t F, const S* gate, const S* up, int64_t ld_in,
                     const S* dg, int64_t ld_g, S* dgate, S* dup, int64_t ld_d);

// The exp used by the float kernels (softmax, loss): Cephes' expf, branch-free so it vectorizes,
// ~1 ulp, input clamped to [-87.3, 88]. Exposed for tests. (SwiGLU, where AVX-512 is compiled in,
// runs the same polynomial with fused multiply-adds on 16 lanes: not these bits.)
float exp_approx(float x);

// ---- Loss -------------------------------------------------------------------------------------
// logits: [N, V] in, replaced by softmax probabilities; lse: [N] log-sum-exp.
// Returns sum_n (lse_n - logit[n, target_n] + z_loss * lse_n^2) (a sum, not a mean), in double.
template <typename S>
double xent_forward(int64_t N, int64_t V, const int32_t* targets, int64_t target_stride,
                    int64_t T, double z_loss, S* logits, S* lse);
// dlogits[n,:] = seed * (p * (1 + 2 z lse_n) - onehot(target_n)).
template <typename S>
void xent_backward(int64_t N, int64_t V, const int32_t* targets, int64_t target_stride,
                   int64_t T, double z_loss, const S* probs, const S* lse, S seed, S* dlogits);

}  // namespace pwm::model
