// Internal: the bf16 matrix product behind gemm<float> when precision() == kBf16 (kernels.h),
// through oneDNN's matmul primitive, in gemm_bf16.cc.
#pragma once

#include <cstdint>
#include <string>

namespace pwm::model::detail {

// True when pwm_model was built with oneDNN (libdnnl-dev found by CMake).
bool bf16_gemm_available();
// Same contract as gemm<float> in kernels.h (row-major, C[M,N] = alpha op(A) op(B) + beta C),
// but A and B are rounded to bf16 (round to nearest even) and the products are summed in fp32;
// C stays fp32. Single-threaded (oneDNN's OpenMP team of one). Deterministic: the same inputs
// and shape give the same bits (one primitive per shape, cached per thread; a fixed ISA).
// Returns false (C untouched) when oneDNN has no bf16 matmul for this CPU (2.6 needs AVX-512:
// on AVX2 it has none) or pwm_model was built without it: the caller then multiplies
// bf16-rounded copies of the operands with the fp32 GEMM (kernels_gemm.cc), the same contract.
bool gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);
// Operands held in bf16 (kernels.h, Bf16Hold): between hold_bf16 and the matching release_bf16
// (LIFO), gemm_bf16 takes any operand lying inside the matrix [rows, cols] at x (leading
// dimension ld; the same ld, any sub-block) from one bf16 copy of it, rounded on first use,
// instead of rounding it again. The caller must not write the matrix in between. Per thread.
void hold_bf16(const float* x, int64_t rows, int64_t cols, int64_t ld);
void release_bf16(const float* x);
// Rounds n floats to bf16 (round to nearest even; NaN stays NaN) and back: what gemm_bf16 does
// to its operands. Exposed for tests.
void round_to_bf16(const float* x, float* y, int64_t n);
// cpuid: AVX512_BF16 (leaf 7.1 EAX bit 5), AMX-BF16 (leaf 7.0 EDX bit 22).
bool cpu_has_avx512_bf16();
bool cpu_has_amx_bf16();
// True when oneDNN runs bf16 matmuls on this CPU (checked once, on a small shape).
bool onednn_bf16_usable();
// "oneDNN 2.6.3, isa avx512_core_bf16" (the ISA oneDNN dispatches to) or "no oneDNN".
std::string onednn_info();
// The oneDNN implementation chosen for a product of this shape, e.g. "brg:avx512_core_bf16".
std::string onednn_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t ldc);

}  // namespace pwm::model::detail
