// The model's composition and training behaviour: forward_backward is bitwise the composition
// of the pieces (also split into pipeline stages), results are deterministic, and AdamW
// overfits one batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/kernels.h"
#include "model/optim.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {
namespace {

Config small_config() {
  Config c;
  c.d_model = 32;
  c.n_layers = 3;
  c.n_heads = 2;
  c.head_dim = 16;
  c.d_ff = 64;
  c.vocab = 32;
  c.seq_len = 16;
  c.z_loss = 1e-4;
  c.seed = 5;
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

TEST(Transformer, ForwardBackwardIsCompositionOfPiecesBitwise) {
  const Config c = small_config();
  const int64_t B = 2;
  const int L = static_cast<int>(c.n_layers);
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total()), g1(lay.total(), 0.0f), g2(lay.total(), 0.0f);
  init_params(lay, c.seed, p.data());
  const auto tokens = testing::random_tokens(c, B, 1);
  Workspace<float> ws(lay, B);
  const float loss1 =
      forward_backward<float>(lay, p.data(), g1.data(), tokens.data(), B, 0.5f, ws, {});

  // Two pipeline stages: layers [0, 1) with the embedding, [1, L) with the head.
  Activations<float> s0(lay, B, 0, 1), s1(lay, B, 1, L);
  Scratch<float> sc(lay, B);
  const size_t NC = static_cast<size_t>(B * c.seq_len * c.d_model);
  embed_forward<float>(lay, p.data(), tokens.data(), s0);
  block_forward<float>(lay, p.data(), 0, s0, sc, {});
  std::memcpy(s1.x(1), s0.x(1), sizeof(float) * NC);  // "send" the activations
  for (int l = 1; l < L; ++l) block_forward<float>(lay, p.data(), l, s1, sc, {});
  const float loss2 = head_forward<float>(lay, p.data(), tokens.data(), s1);
  head_backward<float>(lay, p.data(), g2.data(), tokens.data(), 0.5f, s1, sc);
  for (int l = L - 1; l >= 1; --l) block_backward<float>(lay, p.data(), g2.data(), l, s1, sc, {});
  std::memcpy(s0.dx(), s1.dx(), sizeof(float) * NC);  // "send" the gradient back
  block_backward<float>(lay, p.data(), g2.data(), 0, s0, sc, {});
  embed_backward<float>(lay, g2.data(), tokens.data(), s0);

  EXPECT_EQ(0, std::memcmp(&loss1, &loss2, sizeof(float)));
  EXPECT_TRUE(same_bits(g1, g2));

  // Same inputs, same bits, on a fresh workspace too.
  std::vector<float> g3(lay.total(), 0.0f);
  Workspace<float> ws2(lay, B);
  const float loss3 =
      forward_backward<float>(lay, p.data(), g3.data(), tokens.data(), B, 0.5f, ws2, {});
  EXPECT_EQ(0, std::memcmp(&loss1, &loss3, sizeof(float)));
  EXPECT_TRUE(same_bits(g1, g3));
}

TEST(Transformer, InitialLossNearUniform) {
  // Embedding std 1/sqrt(C) makes the tied logits start at unit scale: loss ~ log(V) + ~0.5.
  const Config c = small_config();
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total());
  init_params(lay, c.seed, p.data());
  const auto tokens = testing::random_tokens(c, 4, 2);
  Workspace<float> ws(lay, 4);
  const float loss = forward_loss<float>(lay, p.data(), tokens.data(), 4, ws, {});
  EXPECT_GT(loss, std::log(32.0) - 0.2);
  EXPECT_LT(loss, std::log(32.0) + 1.5);
}

// Causality: changing input token k changes no prediction at positions < k (bitwise), and does
// change the prediction at k.
TEST(Transformer, CausalNoLeakFromTheFuture) {
  const Config c = small_config();
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total());
  init_params(lay, c.seed, p.data());
  const int64_t T = c.seq_len, V = c.vocab, k = 9;
  auto tokens = testing::random_tokens(c, 1, 4);
  Workspace<float> ws(lay, 1);
  forward_loss<float>(lay, p.data(), tokens.data(), 1, ws, {});
  const std::vector<float> before = ws.act.probs;
  tokens[k] = (tokens[k] + 1) % static_cast<int32_t>(V);
  forward_loss<float>(lay, p.data(), tokens.data(), 1, ws, {});
  EXPECT_EQ(0, std::memcmp(before.data(), ws.act.probs.data(), sizeof(float) * k * V));
  EXPECT_NE(0, std::memcmp(before.data() + k * V, ws.act.probs.data() + k * V, sizeof(float) * V));
  EXPECT_EQ(T, 16);
}

TEST(Transformer, OverfitsOneBatch) {
  const Config c = small_config();
  const int64_t B = 4;
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total()), g(lay.total()), m(lay.total(), 0.0f), v(lay.total(), 0.0f);
  init_params(lay, c.seed, p.data());
  auto tokens = testing::random_tokens(c, B, 3);
  for (int64_t b = 0; b < B; ++b) tokens[b * (c.seq_len + 1)] = static_cast<int32_t>(b);
  Workspace<float> ws(lay, B);
  AdamWConfig opt;
  opt.lr = 1e-2;
  opt.weight_decay = 0.0;
  opt.warmup_steps = 10;
  float loss = 0;
  int step = 0;
  for (; step < 400; ++step) {
    std::fill(g.begin(), g.end(), 0.0f);
    loss = forward_backward<float>(lay, p.data(), g.data(), tokens.data(), B, 1.0f, ws, {});
    if (loss < 0.05f) break;
    const double clip = clip_factor(opt, grad_sq_norm_tp(lay, g.data()));
    adamw_step(opt, lay, step, lr_at(opt, step), clip, p.data(), g.data(), m.data(), v.data());
  }
  EXPECT_LT(loss, 0.1f) << "after " << step << " steps";
}

TEST(Transformer, RejectsBadTokens) {
  const Config c = small_config();
  const ParamLayout lay(c, 0, 1);
  std::vector<float> p(lay.total());
  init_params(lay, c.seed, p.data());
  auto tokens = testing::random_tokens(c, 1, 3);
  tokens[2] = static_cast<int32_t>(c.vocab);
  Workspace<float> ws(lay, 1);
  EXPECT_THROW(forward_loss<float>(lay, p.data(), tokens.data(), 1, ws, {}), pwm::Error);
}

TEST(Kernels, ExpApproxIsAccurate) {
  double worst = 0;
  for (float x = -80.0f; x <= 80.0f; x += 0.01234f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(exp_approx(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // float eps is 1.2e-7: within ~2 ulp
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  EXPECT_GT(exp_approx(-1000.0f), 0.0f);  // clamped: finite, positive
  EXPECT_TRUE(std::isfinite(exp_approx(1000.0f)));
}

// SwiGLU in float (16 lanes with masked tails where the CPU has AVX-512) against the formula in
// double with the library exp: row lengths with and without a partial last vector, gate values
// through the exp's clamp, and the columns past F untouched (they belong to other operands).
// Tolerance 2e-6 of each result's scale: a few float roundings (~6e-8 each) through exp, the
// reciprocal and up to four products; d(gate)'s 1 + a (1 - sig) is scaled by 1 + |a|.
TEST(Kernels, SwigluMatchesDoubleFormula) {
  const float kSentinel = 12345.0f;
  for (const int64_t F : {1, 15, 16, 37, 64}) {
    const int64_t N = 5, ld = F + 3;
    std::vector<float> gate(N * ld), up(N * ld), dg(N * ld);
    for (int64_t i = 0; i < N * ld; ++i) {
      gate[i] = static_cast<float>(std::sin(0.7 * i) * 12.0);
      up[i] = static_cast<float>(std::cos(1.3 * i) * 2.0);
      dg[i] = static_cast<float>(std::sin(2.1 * i + 1.0));
    }
    gate[0] = -200.0f;   // exp(200) is clamped to exp(88)
    gate[ld] = 150.0f;   // exp(-150) is clamped to exp(-87.3)
    std::vector<float> g(N * ld, kSentinel), dgate(N * ld, kSentinel), dup(N * ld, kSentinel);
    swiglu_forward<float>(N, F, gate.data(), up.data(), ld, g.data(), ld);
    swiglu_backward<float>(N, F, gate.data(), up.data(), ld, dg.data(), ld, dgate.data(),
                           dup.data(), ld);
    double worst = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < ld; ++i) {
        const int64_t j = n * ld + i;
        if (i >= F) {
          EXPECT_EQ(g[j], kSentinel) << "F=" << F << " wrote column " << i;
          EXPECT_EQ(dgate[j], kSentinel) << "F=" << F << " wrote column " << i;
          EXPECT_EQ(dup[j], kSentinel) << "F=" << F << " wrote column " << i;
          continue;
        }
        const double a = gate[j], b = up[j], d = dg[j], sig = 1.0 / (1.0 + std::exp(-a));
        const auto check = [&](float got, double want, double scale) {
          const double err = std::abs(got - want) / (scale + 1e-30);
          worst = std::max(worst, err);
          EXPECT_LE(err, 2e-6) << "F=" << F << " n=" << n << " i=" << i << " a=" << a;
        };
        check(g[j], a * b * sig, std::abs(a * b));
        check(dup[j], d * a * sig, std::abs(d * a));
        check(dgate[j], d * b * sig * (1.0 + a * (1.0 - sig)), std::abs(d * b) * (1.0 + std::abs(a)));
      }
    EXPECT_GT(worst, 0.0) << "a float result equal to double everywhere: the check is not looking";
  }
}

// Every backend against a double-precision reference, all transpose cases, with shapes that
// leave partial register tiles (M % 14, N % 32, N % 32 < 16 and > 16), partial 16 x 16 packing
// blocks (K % 16, M or N < 16), several K blocks (K > 512) and M blocks (M > 84), and the
// attention's shapes (32-row causal blocks: K or N a multiple of 32 up to 128).
TEST(Kernels, GemmBackendsAgreeWithReference) {
  struct Shape { int64_t M, N, K; };
  const Shape shapes[] = {{37, 29, 41},  {130, 70, 800}, {1, 1, 1},     {14, 32, 512},
                          {97, 33, 5},   {25, 50, 17},   {16, 16, 16},  {7, 3, 1000},
                          {128, 96, 64}, {64, 64, 128},  {200, 260, 31}};
  std::vector<GemmBackend> backends = {GemmBackend::kEigen};
  if (have_blas()) backends.push_back(GemmBackend::kBlas);
  if (have_avx512_gemm()) backends.push_back(GemmBackend::kAvx512);
  const GemmBackend saved = gemm_backend();
  for (const Shape& sh : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t M = sh.M, N = sh.N, K = sh.K, lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1,
                      ldc = N + 2;
        std::vector<float> A((ta ? K : M) * lda), Bm((tb ? N : K) * ldb), C0(M * ldc);
        for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.1f * i);
        for (size_t i = 0; i < Bm.size(); ++i) Bm[i] = std::cos(0.07f * i);
        for (size_t i = 0; i < C0.size(); ++i) C0[i] = std::sin(0.3f * i);
        for (float beta : {0.0f, 1.0f, 2.0f}) {
          std::vector<double> ref(M * N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k)
                acc += double(ta ? A[k * lda + i] : A[i * lda + k]) *
                       double(tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
              ref[i * N + j] = 0.5 * acc + (beta == 0 ? 0.0 : beta * double(C0[i * ldc + j]));
            }
          for (GemmBackend be : backends) {
            set_gemm_backend(be);
            std::vector<float> C = C0;
            if (beta == 0)  // C's old values must be ignored
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = std::nanf("");
            gemm<float>(ta, tb, M, N, K, 0.5f, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
            double worst = 0;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j)
                worst = std::max(worst, std::abs(C[i * ldc + j] - ref[i * N + j]));
            EXPECT_LE(worst, 1e-5 * K) << gemm_backend_name(be) << " M=" << M << " N=" << N
                                        << " K=" << K << " ta=" << ta << " tb=" << tb
                                        << " beta=" << beta;
            // The padding column between rows must be untouched.
            for (int64_t i = 0; i < M; ++i)
              EXPECT_EQ(std::memcmp(&C[i * ldc + N], &C0[i * ldc + N], 2 * sizeof(float)), 0);
          }
        }
      }
  set_gemm_backend(saved);
}

// gemm_rows: the callback sees increasing, disjoint row ranges covering [0, M), and when it sees
// rows [i0, i1) they already hold their final values; C is the same bits as plain gemm. Shapes
// with several row blocks (M > 84) and K blocks (K > 512), on every backend.
TEST(Kernels, GemmRowsSeesFinalRowsInOrder) {
  std::vector<GemmBackend> backends = {GemmBackend::kEigen};
  if (have_blas()) backends.push_back(GemmBackend::kBlas);
  if (have_avx512_gemm()) backends.push_back(GemmBackend::kAvx512);
  const GemmBackend saved = gemm_backend();
  struct Shape { int64_t M, N, K; };
  for (const Shape sh : {Shape{250, 70, 800}, Shape{97, 33, 5}, Shape{1, 1, 1}})
    for (bool ta : {false, true})
      for (GemmBackend be : backends) {
        set_gemm_backend(be);
        const int64_t M = sh.M, N = sh.N, K = sh.K, lda = ta ? M : K, ldc = N + 1;
        std::vector<float> A(M * K), Bm(K * N), C0(M * ldc);
        for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.1f * i);
        for (size_t i = 0; i < Bm.size(); ++i) Bm[i] = std::cos(0.07f * i);
        for (size_t i = 0; i < C0.size(); ++i) C0[i] = std::sin(0.3f * i);
        std::vector<float> plain = C0, fused = C0, seen(M * ldc, std::nanf(""));
        gemm<float>(ta, false, M, N, K, 0.5f, A.data(), lda, Bm.data(), N, 1.0f, plain.data(), ldc);
        int64_t next = 0;
        gemm_rows<float>(ta, false, M, N, K, 0.5f, A.data(), lda, Bm.data(), N, 1.0f, fused.data(),
                         ldc, [&](int64_t i0, int64_t i1) {
                           EXPECT_EQ(i0, next);
                           EXPECT_LT(i0, i1);
                           next = i1;
                           std::memcpy(&seen[i0 * ldc], &fused[i0 * ldc],
                                       sizeof(float) * ((i1 - i0 - 1) * ldc + N));
                         });
        EXPECT_EQ(next, M) << gemm_backend_name(be);
        for (int64_t i = 0; i < M; ++i) {
          EXPECT_EQ(std::memcmp(&fused[i * ldc], &plain[i * ldc], sizeof(float) * N), 0)
              << gemm_backend_name(be) << " row " << i;
          EXPECT_EQ(std::memcmp(&seen[i * ldc], &plain[i * ldc], sizeof(float) * N), 0)
              << gemm_backend_name(be) << " row " << i << " was not final when passed to rows";
        }
      }
  set_gemm_backend(saved);
}

}  // namespace
}  // namespace pwm::model
