// Single-threaded AVX-512 SGEMM for row-major matrices (Goto/BLIS blocking, A read in place).
//
// Why it exists: on this machine OpenBLAS's sgemm runs its AVX2 (Haswell) kernels whenever
// OPENBLAS_CORETYPE says so (it is set in our environment), ~65 GFLOP/s, while the core can do
// twice that with AVX-512. Eigen's AVX-512 GEMM reaches ~58. This kernel covers the model's
// float products; doubles (tests) stay on BLAS.
//
// Scheme: C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C.
//   for each KC-block of K (kKC = 512):
//     pack op(B)[k-block, :] into NR-column micro-panels (NR = 32, zero padded)   ~ L2/L3
//     for each MC-block of M (kMC = 84 rows; its A rows stay in L2 across the B panels):
//       for each B micro-panel (64 KB at KC = 512, about the L1), for each MR-row slice of A:
//         14 x 32 register tile: per k, two 16-wide loads of B, 14 broadcasts of A, 28 FMAs
//         (28 accumulators + 2 B + 1 A = 31 of the 32 zmm registers; 2% faster steps than 12 x 32
//         on Zen 5, MC = 84 to stay a multiple; MR and MC change no sum's order, so no bits).
// (KC, MC) = (384, 96) measured best among 192..512 x 48..192 on the model's shapes (MR = 12,
// A packed). With A read in place, KC = 512..768 gave 2-2.5% faster steps than 384 and the same
// as each other (256: 1% slower): fewer passes over C and fewer tile epilogues per FMA. KC sets
// where a sum over k is split, so it changes bits (the trainers still agree with each other).
// A is not packed: the kernel broadcasts its 14 elements per k straight from A, along 14 rows
// (A stored [M, K]) or from one row (A stored [K, M]), at a run-time stride. Only a last slice of
// fewer than 14 rows is copied into a zero-padded panel (the kernel always reads 14). The model's
// N = 256 products have A 10x the size of B; copying it cost ~8% of the fp32 step, mostly waiting
// on A's cache misses, which the kernel's FMAs now overlap. (Measured with model_bench, the two
// ways alternating step by step in one process: 3-5% faster steps, same bits.)
// While an MC block computes, the next block of A is prefetched into L2 (NextBlock below).
// B is packed (it is reused by every row of A): row by row with software prefetch a few rows
// ahead (~1.5% of the step), or, stored [N, K], transposed 16 x 16 in registers.
// Every element of C is the sum over k in increasing order within a KC block, blocks added in
// order: results depend only on the shapes, never on addresses or timing (deterministic).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/gemm_avx512.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pwm::model::detail {

#if defined(__AVX512F__)

namespace {

constexpr int64_t kMR = 14;
constexpr int64_t kNR = 32;
constexpr int64_t kKC = 512;
constexpr int64_t kMC = 84;  // multiple of kMR
constexpr int64_t kPrefetchRows = 4;  // pack_b: rows of B ahead (1, 2, 4, 8, 16 tried; 4 best)

// The next MC block of A, brought into L2 while this block computes: `lines` cache lines per
// row of A's storage, `rows` rows at stride ld, one line per kPrefetchEvery k steps of the
// micro-kernels (a block runs N/kNR x mc/kMR of them, so the prefetches are spread over it; at
// the model's shapes they all issue within the block, except for a transposed A with N = 256:
// 3072 of its 3584 lines). Without it each block's first micro-kernels wait
// on A's misses (A is read in place, 14 streams of rows the hardware prefetcher picks up late).
// Measured with model_bench, on and off alternating step by step in one process: on/off step
// time 0.979, 0.983, 0.990 (fp32). Prefetches change no result.
constexpr int64_t kPrefetchEvery = 8;  // k steps per prefetch (4 measured the same)
struct NextBlock {
  const float* base = nullptr;
  int64_t ld = 0, lines = 0, rows = 0;
  int64_t row = 0, line = 0;  // the next line to fetch
  void fetch_one() {
    if (row >= rows) return;
    _mm_prefetch(reinterpret_cast<const char*>(base + row * ld + line * 16), _MM_HINT_T1);
    if (++line == lines) line = 0, ++row;
  }
};

struct PackBuffers {
  std::vector<float> a, b;
};
thread_local PackBuffers t_pack;

// Aligned-enough pointer into a vector grown on demand (no allocation once warmed up).
float* buffer(std::vector<float>& v, size_t n) {
  if (v.size() < n + 16) v.resize(n + 16);
  auto p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
}

// In-register transpose of a 16 x 16 block: r[i] holds row i on entry, column i on exit.
// Three shuffle stages (32-bit, 64-bit, then 128-bit lanes twice), 64 shuffles per 256 floats.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]),
                  t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  // Now r[4g + j], 128-bit lane L = rows 4g..4g+3 of column j + 4L.
  __m512 o[16];
  for (int j = 0; j < 4; ++j) {
    const __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    const __m512 b = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    const __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    o[j] = _mm512_shuffle_f32x4(a, c, 0x88);
    o[j + 8] = _mm512_shuffle_f32x4(a, c, 0xdd);
    o[j + 4] = _mm512_shuffle_f32x4(b, d, 0x88);
    o[j + 12] = _mm512_shuffle_f32x4(b, d, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = o[i];
}

inline __mmask16 low_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Transposing pack, 16 x 16 blocks in registers: source rows src + i * ld (i < rows <= 16),
// columns [0, kc) -> out[k * stride + i], rows >= `rows` as zeros; store_mask picks the lanes i
// written (the first kMR for A's panels, all 16 for B's half panels).
inline void pack_transposed(const float* src, int64_t ld, int64_t rows, int64_t kc, float* out,
                            int64_t stride, __mmask16 store_mask) {
  for (int64_t k = 0; k < kc; k += 16) {
    const int64_t w = std::min<int64_t>(16, kc - k);
    const __mmask16 lm = low_mask(w);
    __m512 r[16];
    for (int64_t i = 0; i < 16; ++i)
      r[i] = i < rows ? _mm512_maskz_loadu_ps(lm, src + i * ld + k) : _mm512_setzero_ps();
    transpose16(r);
    for (int64_t j = 0; j < w; ++j) _mm512_mask_storeu_ps(out + (k + j) * stride, store_mask, r[j]);
  }
}

// op(B)[k0:k0+kc, 0:N] -> panels of kNR columns: panel j holds, for each k, kNR floats.
void pack_b(bool tb, const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t N, float* out) {
  if (!tb) {  // row by row: each source row is read once, contiguously (prefetch friendly)
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = B + (k0 + k) * ldb;
      const float* ahead = k + kPrefetchRows < kc ? src + kPrefetchRows * ldb : nullptr;
      for (int64_t j0 = 0; j0 < N; j0 += kNR) {
        const int64_t nr = std::min(kNR, N - j0);
        if (ahead) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead + j0), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(ahead + j0 + 16), _MM_HINT_T0);
        }
        float* o = out + j0 * kc + k * kNR;  // panel j0 / kNR, size kc * kNR
        _mm512_store_ps(o, _mm512_maskz_loadu_ps(low_mask(nr), src + j0));
        _mm512_store_ps(o + 16, _mm512_maskz_loadu_ps(low_mask(nr - 16), src + j0 + 16));
      }
    }
    return;
  }
  for (int64_t j0 = 0; j0 < N; j0 += kNR) {  // B stored [N, K]: its rows become panel columns
    const int64_t nr = std::min(kNR, N - j0);
    const float* src = B + j0 * ldb + k0;
    float* o = out + j0 * kc;  // panel size kc * kNR
    pack_transposed(src, ldb, std::min<int64_t>(nr, 16), kc, o, kNR, 0xFFFF);
    if (nr > 16) pack_transposed(src + 16 * ldb, ldb, nr - 16, kc, o + 16, kNR, 0xFFFF);
    else for (int64_t k = 0; k < kc; ++k) _mm512_store_ps(o + k * kNR + 16, _mm512_setzero_ps());
  }
}

// A slice of fewer than kMR rows, op(A)[i0:i0+mr, k0:k0+kc], copied in the layout the kernel
// reads A in place, padded with zero rows to kMR: out[r * kKC + k] (A stored [M, K]: rows stay
// rows, at a stride of kKC) or out[k * kMR + r] (A stored [K, M]).
void pack_a_slice(bool ta, const float* A, int64_t lda, int64_t i0, int64_t mr, int64_t k0,
                  int64_t kc, float* out) {
  static_assert(kMR <= 16);
  if (ta) {
    constexpr __mmask16 kStore = (1u << kMR) - 1;
    for (int64_t k = 0; k < kc; ++k)
      _mm512_mask_storeu_ps(out + k * kMR, kStore,
                            _mm512_maskz_loadu_ps(low_mask(mr), A + (k0 + k) * lda + i0));
    return;
  }
  for (int64_t r = 0; r < kMR; ++r)
    for (int64_t k = 0; k < kc; k += 16)
      _mm512_storeu_ps(out + r * kKC + k,
                       r < mr ? _mm512_maskz_loadu_ps(low_mask(kc - k), A + (i0 + r) * lda + k0 + k)
                              : _mm512_setzero_ps());
}

// C tile [mr, nr] (= or +=) alpha * A . Bp over kc. `first`: this is the first K block, so C is
// combined with beta (beta == 0: overwritten); otherwise accumulated. A holds kMR rows (always
// read, mr <= kMR of them stored): element (r, k) at Ap[r * sa + k] when kRowA (A stored [M, K]),
// else at Ap[k * sa + r] (A stored [K, M]).
template <bool kRowA>
void micro_kernel(int64_t kc, const float* Ap, int64_t sa, const float* Bp, float* C, int64_t ldc,
                  int64_t mr, int64_t nr, float alpha, float beta, bool first, NextBlock& next) {
  __m512 c[kMR][2];
  for (int r = 0; r < kMR; ++r) c[r][0] = c[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    if (k % kPrefetchEvery == 0) next.fetch_one();
    const __m512 b0 = _mm512_load_ps(Bp + k * kNR);
    const __m512 b1 = _mm512_load_ps(Bp + k * kNR + 16);
    const float* a = kRowA ? Ap + k : Ap + k * sa;
#pragma GCC unroll 14
    for (int r = 0; r < kMR; ++r) {
      const __m512 av = _mm512_set1_ps(a[kRowA ? r * sa : r]);
      c[r][0] = _mm512_fmadd_ps(av, b0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(av, b1, c[r][1]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  // C's old values count on a later K block (accumulate) or with beta != 0 (alpha AB + beta C).
  const bool load = !first || beta != 0.0f;
  const auto out = [&](__m512 acc, __m512 old) {
    const __m512 v = _mm512_mul_ps(acc, va);
    return !load ? v : first ? _mm512_add_ps(v, _mm512_mul_ps(old, vb)) : _mm512_add_ps(old, v);
  };
  if (mr == kMR && nr == kNR) {
    // A full tile (the common case): unrolled, unmasked loads and stores. Measured ~2% faster
    // steps than the masked loop below alone, and than one unrolled masked loop for both. (GCC
    // stores the 28 accumulators to the stack after the K loop and reloads them here in every
    // form tried: 28 + 5 live vectors exceed the 32 registers. ~56 memory operations per tile
    // against kc x 28 FMAs: under 1% at kc = 512.)
#pragma GCC unroll 14
    for (int r = 0; r < kMR; ++r) {
      float* row = C + r * ldc;
      const __m512 o0 = load ? _mm512_loadu_ps(row) : _mm512_setzero_ps();
      const __m512 o1 = load ? _mm512_loadu_ps(row + 16) : _mm512_setzero_ps();
      _mm512_storeu_ps(row, out(c[r][0], o0));
      _mm512_storeu_ps(row + 16, out(c[r][1], o1));
    }
    return;
  }
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xFFFF)
                       : nr <= 16 ? __mmask16(0)
                                  : __mmask16((1u << (nr - 16)) - 1);
  for (int r = 0; r < mr; ++r) {
    float* row = C + r * ldc;
    const __m512 o0 = load ? _mm512_maskz_loadu_ps(m0, row) : _mm512_setzero_ps();
    const __m512 o1 = load ? _mm512_maskz_loadu_ps(m1, row + 16) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(row, m0, out(c[r][0], o0));
    _mm512_mask_storeu_ps(row + 16, m1, out(c[r][1], o1));
  }
}

}  // namespace

bool sgemm_avx512_available() { return true; }

void sgemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                  const std::function<void(int64_t, int64_t)>* rows) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // C = beta * C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    if (rows) (*rows)(0, M);
    return;
  }
  const int64_t n_pad = (N + kNR - 1) / kNR * kNR;
  float* bp = buffer(t_pack.b, static_cast<size_t>(kKC * n_pad));
  float* ap = buffer(t_pack.a, static_cast<size_t>(kKC * kMR));  // a partial slice of A
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kc = std::min(kKC, K - k0);
    const bool first = k0 == 0;
    pack_b(tb, B, ldb, k0, kc, N, bp);
    for (int64_t i0 = 0; i0 < M; i0 += kMC) {
      const int64_t mc = std::min(kMC, M - i0);
      NextBlock next;
      if (i0 + mc < M) {
        const int64_t mn = std::min(kMC, M - i0 - mc);
        if (ta)  // A stored [K, M]: rows k0..k0+kc, columns i0+mc.. (+1 line: not aligned)
          next = {A + k0 * lda + i0 + mc, lda, (mn + 15) / 16 + 1, kc};
        else     // A stored [M, K]: rows i0+mc.., columns k0..k0+kc
          next = {A + (i0 + mc) * lda + k0, lda, (kc + 15) / 16, mn};
      }
      const int64_t tail = mc % kMR;  // rows of a last, partial slice (only in the last block)
      if (tail) pack_a_slice(ta, A, lda, i0 + mc - tail, tail, k0, kc, ap);
      for (int64_t j0 = 0; j0 < N; j0 += kNR) {
        const int64_t nr = std::min(kNR, N - j0);
        const float* bpanel = bp + j0 * kc;
        for (int64_t r0 = 0; r0 < mc; r0 += kMR) {
          const int64_t mr = std::min(kMR, mc - r0);
          float* c = C + (i0 + r0) * ldc + j0;
          const bool in_place = mr == kMR;
          if (ta)
            micro_kernel<false>(kc, in_place ? A + k0 * lda + i0 + r0 : ap, in_place ? lda : kMR,
                                bpanel, c, ldc, mr, nr, alpha, beta, first, next);
          else
            micro_kernel<true>(kc, in_place ? A + (i0 + r0) * lda + k0 : ap, in_place ? lda : kKC,
                               bpanel, c, ldc, mr, nr, alpha, beta, first, next);
        }
      }
      if (rows && k0 + kc == K) (*rows)(i0, i0 + mc);  // the last K block: these rows are final
    }
  }
}

#else  // no AVX-512 at compile time (PORTABLE=ON): callers use BLAS or Eigen.

bool sgemm_avx512_available() { return false; }
void sgemm_avx512(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                  const float*, int64_t, float, float*, int64_t,
                  const std::function<void(int64_t, int64_t)>*) {}

#endif

}  // namespace pwm::model::detail
