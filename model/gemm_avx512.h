// Internal: the AVX-512 SGEMM behind gemm<float> (kernels.h), in gemm_avx512.cc.
#pragma once

#include <cstdint>
#include <functional>

namespace pwm::model::detail {

// True when the library was compiled with AVX-512 (the default -march=native on this machine).
bool sgemm_avx512_available();
// Same contract as gemm<float> in kernels.h: row-major, C[M,N] = alpha op(A) op(B) + beta C.
// Single-threaded; packing buffers are thread_local and reused (no allocation once warmed up).
// rows (optional): called with [i0, i1) as soon as those rows of C are final (block by block,
// increasing, covering [0, M)), while they are still in cache: gemm_rows in kernels.h.
void sgemm_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc, const std::function<void(int64_t, int64_t)>* rows = nullptr);

}  // namespace pwm::model::detail
