// The step's products (gemm_probe.h), listed call by call as transformer_block.cc,
// transformer.cc and moe.cc make them; tests/model/test_gemm_probe.cc checks the list against
// the calls a real forward and backward makes (gemm profiling) and against FLOPs by hand.
#include "model/gemm_probe.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/time.h"
#include "model/kernels.h"
#include "model/transformer.h"

namespace pwm::model {

namespace {

// Appends a product, or adds `count` to the entry of the same product.
void add(std::vector<GemmCall>& calls, GemmCall g) {
  for (GemmCall& c : calls)
    if (c.trans_a == g.trans_a && c.trans_b == g.trans_b && c.M == g.M && c.N == g.N && c.K == g.K && c.lda == g.lda &&
        c.ldb == g.ldb && c.ldc == g.ldc && c.beta == g.beta) {
      c.count += g.count;
      return;
    }
  calls.push_back(std::move(g));
}

GemmCall call(const char* what, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
              float beta, int64_t count) {
  return GemmCall{ta, tb, M, N, K, lda, ldb, ldc, beta, count, what};
}

// The attention core of one layer for B sequences (block_forward / block_backward): per
// sequence and causal block of query rows [t0, t1), rows = (t1 - t0) Hs.
void attention(std::vector<GemmCall>& out, bool backward, int64_t B, int64_t T, int64_t Hs, int64_t D, int64_t R_in) {
  if (!backward) {
    for (int64_t t0 = 0; t0 < T; t0 += kAttentionQueryBlock) {
      const int64_t t1 = std::min(T, t0 + kAttentionQueryBlock), rows = (t1 - t0) * Hs;
      add(out, call("attn scores", false, true, rows, t1, D, D, D, T, 0, B));  // q_b . k_b^T
    }
    for (int64_t t0 = 0; t0 < T; t0 += kAttentionQueryBlock) {
      const int64_t t1 = std::min(T, t0 + kAttentionQueryBlock), rows = (t1 - t0) * Hs;
      add(out, call("attn p.v", false, false, rows, D, t1, T, R_in, D, 0, B));
    }
    return;
  }
  for (int64_t t0 = 0; t0 < T; t0 += kAttentionQueryBlock) {
    const int64_t t1 = std::min(T, t0 + kAttentionQueryBlock), rows = (t1 - t0) * Hs;
    add(out, call("attn d(p)", false, true, rows, t1, D, D, R_in, T, 0, B));  // dO . v^T
  }
  const int64_t last = ((T - 1) / kAttentionQueryBlock) * kAttentionQueryBlock;
  for (int64_t t0 = last; t0 >= 0; t0 -= kAttentionQueryBlock) {
    const int64_t t1 = std::min(T, t0 + kAttentionQueryBlock), rows = (t1 - t0) * Hs;
    const float beta = t0 == last ? 0.0f : 1.0f;
    add(out, call("attn d(v)", true, false, t1, D, rows, T, D, R_in, beta, B));  // P^T . dO
    add(out, call("attn d(q)", false, false, rows, D, t1, T, D, D, 0, B));      // dS . k
    add(out, call("attn d(k)", true, false, t1, D, rows, T, D, D, beta, B));    // dS^T . q
  }
}

// An MoE layer's experts (moe.cc experts_forward / experts_backward) over blocks of `rows`.
void experts(std::vector<GemmCall>& out, bool backward, int64_t C, int64_t F, const std::vector<int64_t>& blocks) {
  for (int64_t rows : blocks) {
    if (rows == 0) continue;  // (moe.cc skips an empty block)
    if (!backward) {
      add(out, call("expert gate_up fwd", false, true, rows, 2 * F, C, C, C, 2 * F, 0, 1));
      add(out, call("expert down fwd", false, false, rows, C, F, F, C, C, 0, 1));
    } else {
      add(out, call("expert d(ge)", false, true, rows, F, C, C, C, F, 0, 1));
      add(out, call("expert d(w_down)", true, false, F, C, rows, F, C, C, 1, 1));
      add(out, call("expert d(w_gate_up)", true, false, 2 * F, C, rows, 2 * F, C, C, 1, 1));
      add(out, call("expert d(x)", false, false, rows, C, 2 * F, 2 * F, C, C, 0, 1));
    }
  }
}

// The rows of each expert block one micro-batch of N tokens computes on one rank (gemm_probe.h).
std::vector<int64_t> expert_blocks(const Config& c, int64_t N) {
  const int64_t E = c.experts, cap = c.expert_capacity(N);
  if (cap >= 0) return std::vector<int64_t>(static_cast<size_t>(E), cap);
  std::vector<int64_t> b(static_cast<size_t>(E), N * c.top_k / E);
  for (int64_t e = 0; e < N * c.top_k % E; ++e) ++b[static_cast<size_t>(e)];
  return b;
}

}  // namespace

std::vector<GemmCall> step_gemm_calls(const ParamLayout& layout, int64_t B) {
  PWM_CHECK(B > 0, "micro-batch size must be positive (got {})", B);
  const Config& c = layout.config();
  const int64_t T = c.seq_len, N = B * T, C = c.d_model, D = c.head_dim, V = c.vocab, Hs = layout.local_heads();
  const int L = static_cast<int>(c.n_layers);
  std::vector<GemmCall> out;
  // Forward: the blocks, then the head.
  for (int l = 0; l < L; ++l) {
    const int64_t R_in = layout.layer(l).rows_in, R_out = layout.layer(l).rows_out;
    add(out, call("w_in fwd", false, true, N, R_in, C, C, C, R_in, 0, 1));  // h . w_in^T
    attention(out, false, B, T, Hs, D, R_in);
    add(out, call("w_out fwd", false, false, N, C, R_out, R_out, C, C, 0, 1));  // ag . w_out
    if (layout.layer(l).moe) experts(out, false, C, c.d_ff, expert_blocks(c, N));
  }
  add(out, call("head logits", false, true, N, V, C, C, C, V, 0, 1));  // hf . E^T
  // Backward: the head, then the blocks in reverse.
  add(out, call("head d(E)", true, false, V, C, N, V, C, C, 1, 1));  // dlogits^T . hf
  add(out, call("head d(hf)", false, false, N, C, V, V, C, C, 0, 1));  // dlogits . E
  for (int l = L - 1; l >= 0; --l) {
    const int64_t R_in = layout.layer(l).rows_in, R_out = layout.layer(l).rows_out;
    add(out, call("d(ag)", false, true, N, R_out, C, C, C, R_out, 0, 1));          // dy . w_out^T
    add(out, call("d(w_out)", true, false, R_out, C, N, R_out, C, C, 1, 1));       // ag^T . dy
    attention(out, true, B, T, Hs, D, R_in);
    add(out, call("d(h)", false, false, N, C, R_in, R_in, C, C, 0, 1));            // dyin . w_in
    add(out, call("d(w_q,gate,up)", true, false, R_in - 2 * D, C, N, R_in, C, C, 1, 1));
    add(out, call("d(wk,wv)", true, false, 2 * D, C, N, R_in, C, C, 0, 1));
    if (layout.layer(l).moe) experts(out, true, C, c.d_ff, expert_blocks(c, N));
  }
  return out;
}

double gemm_flops(const std::vector<GemmCall>& calls) {
  double f = 0;
  for (const GemmCall& g : calls) f += static_cast<double>(g.count) * g.flops();
  return f;
}

namespace {

// Elements a stored operand of `rows` x `cols` at leading dimension `ld` spans.
size_t span(int64_t rows, int64_t cols, int64_t ld) { return static_cast<size_t>((rows - 1) * ld + cols); }

// Values in [-1, 1], cheap to make (the probe's start-up should be its products, not its RNG).
void fill(std::vector<float>& v, uint32_t salt) {
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((static_cast<uint32_t>(i) * 2654435761u + salt) >> 21) / 1024.0f - 1.0f;
}

}  // namespace

GemmProbe::GemmProbe(const ParamLayout& layout, int64_t B) : calls_(step_gemm_calls(layout, B)) {
  size_t a = 0, b = 0, c = 0;
  for (const GemmCall& g : calls_) {
    a = std::max(a, g.trans_a ? span(g.K, g.M, g.lda) : span(g.M, g.K, g.lda));
    b = std::max(b, g.trans_b ? span(g.N, g.K, g.ldb) : span(g.K, g.N, g.ldb));
    c = std::max(c, span(g.M, g.N, g.ldc));
  }
  a_.resize(a);
  b_.resize(b);
  c_.resize(c);
  fill(a_, 1);
  fill(b_, 2);
  fill(c_, 3);
  best_s_.assign(calls_.size(), std::numeric_limits<double>::infinity());
  flops_ = gemm_flops(calls_);
}

double GemmProbe::run(double budget_s) {
  ++probes_;
  const bool every = budget_s <= 0 || timed_ < calls_.size();
  const double start = now_s();
  for (size_t visited = 0; visited < calls_.size(); ++visited) {
    const GemmCall& g = calls_[next_];
    const double t0 = now_s();
    gemm<float>(g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, a_.data(), g.lda, b_.data(), g.ldb, g.beta, c_.data(), g.ldc);
    const double dt = std::max(now_s() - t0, 1e-9);
    if (std::isinf(best_s_[next_])) ++timed_;
    best_s_[next_] = std::min(best_s_[next_], dt);
    next_ = (next_ + 1) % calls_.size();
    if (!every && now_s() - start >= budget_s) break;
  }
  return gflops();
}

double GemmProbe::gflops() const {
  if (timed_ < calls_.size()) return 0.0;
  double s = 0;
  for (size_t i = 0; i < calls_.size(); ++i) s += static_cast<double>(calls_[i].count) * best_s_[i];
  return flops_ / s / 1e9;
}

}  // namespace pwm::model
