// bf16 matrix products through oneDNN (docs/model_kernels.md, "bf16").
//
// Why this shape: oneDNN's matmul picks the best kernel for the CPU at run time (AMX, AVX512-BF16
// vdpbf16ps, or an AVX-512/AVX2 fallback that upconverts), so one code path serves every x86
// CPU. The model's tensors stay fp32; each call rounds its two operands to bf16 into per-thread
// buffers (the stored layout is kept: oneDNN's brgemm takes transposed operands directly) and
// oneDNN accumulates in fp32 into the fp32 C. alpha is an output scale, beta a sum post-op.
//
// Rounding is memory-bound (read 4 bytes, write 2, on cold activations): it was ~15% of a bf16
// step. A block's backward reads d(yin) in three products and h and dy in two each; Bf16Hold
// (kernels.h) lets it round each once into a bf16 copy that the products then read through a
// strided memory descriptor (5% faster steps in model_bench, alternating step by step). A strided
// A (lda > M) makes oneDNN 2.6 choose its jit gemm over brgemm, which is faster for the
// transposed-A products here (dW_in: 228 -> 332 GFLOP/s in the step, rounding included) and sums
// in another order: the held and unheld bits differ, each deterministic.
//
// Determinism: a primitive is created once per (shape, transposes, ldc, alpha, beta) and cached
// per thread; with one thread and a fixed ISA a primitive sums in a fixed order, so the same
// inputs give the same bits. Every rank of a job runs the same shapes on the same ISA, which is
// why spmd_train and pathways_train stay bitwise equal in bf16 as in fp32.
#include "model/gemm_bf16.h"

#include <cpuid.h>

#include <cstring>
#include <vector>

#include "common/check.h"

#ifdef PWM_HAVE_ONEDNN
#include <omp.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#endif

namespace pwm::model::detail {

namespace {

// Round to nearest even on the bit pattern (what vcvtneps2bf16 does); a NaN keeps a quiet NaN
// (adding the rounding bias could carry it into infinity). Branch-free so it vectorizes.
inline uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

// Rows x cols of a row-major matrix with leading dimension ld, packed densely as bf16.
void pack_bf16(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld;
    uint16_t* o = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) o[c] = to_bf16_bits(xr[c]);
  }
}

}  // namespace

void round_to_bf16(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(to_bf16_bits(x[i])) << 16;
    std::memcpy(&y[i], &u, 4);
  }
}

bool cpu_has_avx512_bf16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u);
}
bool cpu_has_amx_bf16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u);
}

#ifndef PWM_HAVE_ONEDNN

bool bf16_gemm_available() { return false; }
bool onednn_bf16_usable() { return false; }
void hold_bf16(const float*, int64_t, int64_t, int64_t) {}
void release_bf16(const float*) {}
bool gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
               int64_t, float, float*, int64_t) {
  return false;
}
std::string onednn_info() { return "no oneDNN"; }
std::string onednn_impl(bool, bool, int64_t, int64_t, int64_t, int64_t) { return "none"; }

#else

namespace {

using dt = dnnl::memory::data_type;

// (ta, tb, M, N, K, ldc, alpha, beta, lda, ldb): everything a primitive is specialized on
// (lda, ldb: of the bf16 operands, dense unless taken from a held matrix).
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, float, float, int64_t,
                       int64_t>;

// A matrix held in bf16 (hold_bf16): its fp32 place and its bf16 copy (dense, ld = cols).
struct Held {
  const float* x = nullptr;
  int64_t rows = 0, cols = 0, ld = 0;
  bool rounded = false;
  std::vector<uint16_t> bf16;  // kept across holds: no allocation once warmed up
};

struct Cached {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
  size_t scratch = 0;  // bytes of scratchpad the primitive needs
};

struct ThreadState {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::map<Key, Cached> prims;
  std::vector<uint16_t> a, b;  // bf16 operands, grown as needed
  std::vector<Held> held;      // a stack: [0, n_held) are live
  size_t n_held = 0;
  // The primitives' scratchpad (user mode): one buffer per thread, grown as needed. oneDNN's
  // default would allocate and free it on every execution, and a large malloc is an mmap whose
  // pages fault in again on every call.
  std::vector<uint8_t> scratch;
};

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

dnnl::matmul::primitive_desc make_pd(const dnnl::engine& eng, const Key& k, Cached& out) {
  const auto [ta, tb, M, N, K, ldc, alpha, beta, lda, ldb] = k;
  // Operands are in bf16 in their stored layout: A is [M,K] or (ta) [K,M] with leading
  // dimension lda; B is [K,N] or (tb) [N,K] with ldb. oneDNN describes op(A) [M,K] and op(B)
  // [K,N] by strides.
  out.a = dnnl::memory::desc({M, K}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  out.b = dnnl::memory::desc({K, N}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  out.c = dnnl::memory::desc({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(out.a, out.b, out.c), attr, eng);
}

Cached& primitive(ThreadState& s, const Key& k) {
  auto it = s.prims.find(k);
  if (it != s.prims.end()) return it->second;
  Cached c;
  const auto pd = make_pd(s.eng, k, c);
  c.scratch = pd.scratchpad_desc().get_size();
  c.prim = dnnl::matmul(pd);
  return s.prims.emplace(k, std::move(c)).first->second;
}

bool probe_usable() {
  try {
    Cached c;
    make_pd(state().eng, Key{false, false, 4, 4, 4, 4, 1.0f, 0.0f, 4, 4}, c);
    return true;
  } catch (const dnnl::error&) {
    return false;  // no bf16 matmul implementation for this ISA
  }
}

// The bf16 copy of the stored matrix [rows, cols] at x (leading dimension ld) when it lies inside
// a held matrix (rounded now if this is its first use), with its leading dimension; else null.
const uint16_t* find_held(ThreadState& s, const float* x, int64_t rows, int64_t cols, int64_t ld,
                          int64_t* ld16) {
  for (size_t i = s.n_held; i-- > 0;) {
    Held& h = s.held[i];
    // Addresses as integers: x and h.x need not point into one array.
    const auto xa = reinterpret_cast<uintptr_t>(x), ha = reinterpret_cast<uintptr_t>(h.x);
    if (h.ld != ld || xa < ha) continue;
    const int64_t off = static_cast<int64_t>((xa - ha) / sizeof(float)), r0 = off / ld, c0 = off % ld;
    if (r0 + rows > h.rows || c0 + cols > h.cols) continue;
    if (!h.rounded) {
      h.bf16.resize(static_cast<size_t>(h.rows * h.cols));
      pack_bf16(h.x, h.rows, h.cols, h.ld, h.bf16.data());
      h.rounded = true;
    }
    *ld16 = h.cols;
    return h.bf16.data() + r0 * h.cols + c0;
  }
  return nullptr;
}

}  // namespace

void hold_bf16(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  PWM_CHECK(rows >= 0 && cols >= 0 && ld >= 1 && ld >= cols, "hold_bf16: bad shape {}x{} ld {}",
            rows, cols, ld);
  ThreadState& s = state();
  if (s.held.size() == s.n_held) s.held.emplace_back();
  Held& h = s.held[s.n_held++];
  h.x = x;
  h.rows = rows;
  h.cols = cols;
  h.ld = ld;
  h.rounded = false;
}

void release_bf16(const float* x) {
  ThreadState& s = state();
  PWM_CHECK(s.n_held > 0 && s.held[s.n_held - 1].x == x, "release_bf16: not the last matrix held");
  --s.n_held;
}

bool bf16_gemm_available() { return true; }
bool onednn_bf16_usable() {
  static const bool usable = probe_usable();
  return usable;
}

bool gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!onednn_bf16_usable()) return false;
  if (K == 0) {  // oneDNN rejects empty reductions; C = beta C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return true;
  }
  // One thread per rank (as every kernel here): oneDNN's OpenMP team of this thread.
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  ThreadState& s = state();
  // Each operand in bf16, in its stored layout: from a held matrix, or rounded into a dense
  // per-thread buffer.
  const auto operand = [&](const float* x, int64_t rows, int64_t cols, int64_t ld,
                           std::vector<uint16_t>& buf, int64_t* ld16) -> const uint16_t* {
    if (const uint16_t* held = find_held(s, x, rows, cols, ld, ld16)) return held;
    if (buf.size() < static_cast<size_t>(rows * cols)) buf.resize(static_cast<size_t>(rows * cols));
    pack_bf16(x, rows, cols, ld, buf.data());
    *ld16 = cols;
    return buf.data();
  };
  int64_t lda16 = 0, ldb16 = 0;
  const uint16_t* a16 = ta ? operand(A, K, M, lda, s.a, &lda16) : operand(A, M, K, lda, s.a, &lda16);
  const uint16_t* b16 = tb ? operand(B, N, K, ldb, s.b, &ldb16) : operand(B, K, N, ldb, s.b, &ldb16);
  Cached& p = primitive(s, Key{ta, tb, M, N, K, ldc, alpha, beta, lda16, ldb16});
  if (s.scratch.size() < p.scratch) s.scratch.resize(p.scratch);
  // oneDNN's memory takes a non-const handle; the primitive only reads SRC and WEIGHTS.
  dnnl::memory ma(p.a, s.eng, const_cast<uint16_t*>(a16)), mb(p.b, s.eng, const_cast<uint16_t*>(b16)),
      mc(p.c, s.eng, C);
  dnnl::memory ms(dnnl::memory::desc({static_cast<int64_t>(p.scratch)}, dt::u8, dnnl::memory::dims{1}),
                  s.eng, s.scratch.data());
  p.prim.execute(s.strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc},
                          {DNNL_ARG_SCRATCHPAD, ms}});
  s.strm.wait();
  return true;
}

std::string onednn_info() {
  const dnnl_version_t* v = dnnl_version();
  std::string isa;
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    default: isa = "isa#" + std::to_string(static_cast<int>(dnnl_get_effective_cpu_isa()));
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + ", isa " + isa;
}

std::string onednn_impl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t ldc) {
  Cached c;
  return make_pd(state().eng, Key{ta, tb, M, N, K, ldc, 1.0f, 0.0f, ta ? M : K, tb ? K : N}, c)
      .impl_info_str();
}

#endif

}  // namespace pwm::model::detail
