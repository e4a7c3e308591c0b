// Mixture of Experts (model/moe.h): routing and capacity on hand-made logits, finite-difference
// gradients of the router and the experts (and every other tensor) in double, E = 1 against the
// dense model, dropless against a capacity that drops nothing, and expert parallelism (ranks as
// threads exchanging rows) against one rank holding every expert.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "common/check.h"
#include "model/kernels.h"
#include "model/moe.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {
namespace {

Config moe_config(int64_t E, int64_t K, double capacity) {
  Config c = testing::tiny_config();
  c.n_layers = 2;
  c.experts = E;
  c.top_k = K;
  c.moe_every = 1;
  c.capacity_factor = capacity;
  c.aux_loss = 0.1;        // large, so that the aux terms matter in the gradient check
  c.router_z_loss = 0.05;
  c.router_skew = 0.3;
  return c;
}

// ---- Routing on hand-made logits ----------------------------------------------------------------

TEST(Moe, CapacityDropsLaterTokensInTokenOrder) {
  Config c = moe_config(3, 1, 1.0);  // capacity ceil(1.0 * 1 * 6 / 3) = 2
  ASSERT_EQ(c.expert_capacity(6), 2);
  // Tokens 0, 1, 2, 4 prefer expert 0; 3 expert 1; 5 ties experts 1 and 2 (-> 1, the lower).
  const std::vector<double> logits = {3, 0, 0,  2, 1, 0,  5, 1, 1,  0, 4, 1,  2, 0, 1,  0, 2, 2};
  MoeState<double> st;
  moe_route(c, 6, logits.data(), st);
  const std::vector<int32_t> want_choice = {0, 0, 0, 1, 0, 1};
  EXPECT_EQ(st.choice, want_choice);
  // Expert 0 takes tokens 0 and 1; tokens 2 and 4 are over its capacity. Expert 1's rows start
  // at 2 (every expert has `capacity` rows: expert-major).
  const std::vector<int64_t> want_slot = {0, 1, -1, 2, -1, 3};
  EXPECT_EQ(st.slot, want_slot);
  EXPECT_EQ(st.expert_rows, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(st.stats.dropped, 2);
  EXPECT_EQ(st.stats.choices, 6);
  EXPECT_EQ(st.stats.expert_tokens, (std::vector<int64_t>{4, 2, 0}));
  // Top-1 gates are the probabilities themselves; lb = E sum_i f_i P_i.
  double lb = 0;
  for (int e = 0; e < 3; ++e) {
    double P = 0;
    for (int n = 0; n < 6; ++n) {
      double z = 0;
      for (int j = 0; j < 3; ++j) z += std::exp(logits[n * 3 + j]);
      const double p = std::exp(logits[n * 3 + e]) / z;
      P += p / 6;
      if (want_choice[n] == e) {
        EXPECT_NEAR(st.gate[n], p, 1e-15);
      }
    }
    lb += (e == 0 ? 4.0 : e == 1 ? 2.0 : 0.0) / 6.0 * P;
  }
  EXPECT_NEAR(st.stats.lb_loss, 3 * lb, 1e-14);
  // Dropless: no slot lost, rows = the counts.
  c.capacity_factor = 0;
  moe_route(c, 6, logits.data(), st);
  EXPECT_EQ(st.stats.dropped, 0);
  EXPECT_EQ(st.expert_rows, (std::vector<int64_t>{4, 2, 0}));
  EXPECT_EQ(st.slot, (std::vector<int64_t>{0, 1, 2, 4, 3, 5}));
}

TEST(Moe, TopTwoGatesAreRenormalized) {
  Config c = moe_config(4, 2, 0.0);
  const std::vector<double> logits = {1, 3, 2, 0,  0, 0, 0, 0};  // token 1: four-way tie -> 0, 1
  MoeState<double> st;
  moe_route(c, 2, logits.data(), st);
  EXPECT_EQ(st.choice, (std::vector<int32_t>{1, 2, 0, 1}));
  const double e3 = std::exp(3.0), e2 = std::exp(2.0);
  EXPECT_NEAR(st.gate[0], e3 / (e3 + e2), 1e-15);
  EXPECT_NEAR(st.gate[1], e2 / (e3 + e2), 1e-15);
  EXPECT_DOUBLE_EQ(st.gate[2], 0.5);
  EXPECT_DOUBLE_EQ(st.gate[3], 0.5);
}

// A dropped token's MLP branch is zero: its output row is left exactly as it was; a kept one gets
// gate * expert(h), checked against a plain double loop.
TEST(Moe, DroppedTokensContributeZero) {
  Config c = moe_config(2, 1, 1.0);
  c.router_skew = 50;  // every token prefers expert 0: capacity ceil(N/2) keeps the first half
  const ParamLayout layout(c, 0, 1);
  std::vector<double> params(static_cast<size_t>(layout.total()));
  init_params(layout, 3, params.data());
  const int l = 0;
  const int64_t N = 8, C = c.d_model, F = c.d_ff;
  std::mt19937 rng(2);
  std::normal_distribution<double> nd;
  std::vector<double> h(static_cast<size_t>(N * C)), out(static_cast<size_t>(N * C));
  for (auto& v : h) v = nd(rng);
  for (auto& v : out) v = nd(rng);
  const std::vector<double> before = out;
  MoeState<double> st;
  MoeScratch<double> sc;
  moe_forward<double>(layout, params.data(), l, h.data(), N, out.data(), st, sc, {});
  EXPECT_EQ(st.stats.dropped, N / 2);
  const LayerOffsets& lo = layout.layer(l);
  for (int64_t n = 0; n < N; ++n) {
    if (n >= N / 2) {
      EXPECT_EQ(0, std::memcmp(&out[n * C], &before[n * C], sizeof(double) * C)) << "token " << n;
      continue;
    }
    std::vector<double> g(static_cast<size_t>(F));
    for (int64_t f = 0; f < F; ++f) {
      double gate = 0, up = 0;
      for (int64_t k = 0; k < C; ++k) {
        gate += h[n * C + k] * params[lo.expert_gate_up + f * C + k];
        up += h[n * C + k] * params[lo.expert_gate_up + (F + f) * C + k];
      }
      g[f] = gate / (1 + std::exp(-gate)) * up;
    }
    for (int64_t k = 0; k < C; ++k) {
      double z = 0;
      for (int64_t f = 0; f < F; ++f) z += g[f] * params[lo.expert_down + f * C + k];
      EXPECT_NEAR(out[n * C + k], before[n * C + k] + st.gate[n] * z, 1e-12) << n << "," << k;
    }
  }
}

// ---- Gradients -----------------------------------------------------------------------------------

// The objective the backward differentiates: the mean loss plus every MoE layer's aux losses.
double objective(const ParamLayout& layout, const std::vector<double>& params, const std::vector<int32_t>& tokens,
                 int64_t B, Workspace<double>& ws) {
  const Config& c = layout.config();
  double f = forward_loss<double>(layout, params.data(), tokens.data(), B, ws, {});
  const MoeStats s = ws.act.moe_stats();
  return f + c.aux_loss * s.lb_loss + c.router_z_loss * s.z_loss;
}

void gradcheck(const Config& c) {
  const ParamLayout layout(c, 0, 1);
  const int64_t B = 2;
  Workspace<double> ws(layout, B);
  std::vector<double> params(static_cast<size_t>(layout.total()));
  init_params(layout, c.seed, params.data());
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0.0, 0.1);
  for (auto& p : params) p += noise(rng);
  const std::vector<int32_t> tokens = testing::random_tokens(c, B, 3);
  std::vector<double> g(static_cast<size_t>(layout.total()), 0.0);
  forward_backward<double>(layout, params.data(), g.data(), tokens.data(), B, 1.0, ws, {});
  const MoeStats routed = ws.act.moe_stats();
  int checked = 0;
  for (const ParamInfo& p : layout.params()) {
    std::uniform_int_distribution<int64_t> pick(0, p.size - 1);
    const int samples = p.kind == ParamKind::kRouter || p.expert ? 24 : 4;
    for (int k = 0; k < samples; ++k) {
      const int64_t i = pick(rng);
      double& x = params[static_cast<size_t>(p.offset + i)];
      const double saved = x;
      x = saved + 1e-5;
      const double up = objective(layout, params, tokens, B, ws);
      const MoeStats su = ws.act.moe_stats();
      x = saved - 1e-5;
      const double down = objective(layout, params, tokens, B, ws);
      x = saved;
      // A step that changes a routing decision is not differentiable there: none may.
      ASSERT_EQ(su.expert_tokens, routed.expert_tokens) << p.name;
      ASSERT_EQ(su.dropped, routed.dropped) << p.name;
      const double fd = (up - down) / 2e-5, an = g[static_cast<size_t>(p.offset + i)];
      EXPECT_NEAR(fd, an, 1e-8 + 1e-6 * std::abs(an)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Moe, GradCheckTop1WithCapacity) {
  Config c = moe_config(4, 1, 1.0);
  gradcheck(c);
}
TEST(Moe, GradCheckTop2Dropless) { gradcheck(moe_config(3, 2, 0.0)); }
TEST(Moe, GradCheckEveryOtherLayer) {
  Config c = moe_config(4, 2, 1.25);
  c.moe_every = 2;
  gradcheck(c);
}

// The drop check above must be able to fail: a capacity of 1.0 over 4 experts drops something.
TEST(Moe, GradCheckConfigDropsTokens) {
  const Config c = moe_config(4, 1, 1.0);
  const ParamLayout layout(c, 0, 1);
  Workspace<double> ws(layout, 2);
  std::vector<double> params(static_cast<size_t>(layout.total()));
  init_params(layout, c.seed, params.data());
  const std::vector<int32_t> tokens = testing::random_tokens(c, 2, 3);
  forward_loss<double>(layout, params.data(), tokens.data(), 2, ws, {});
  EXPECT_GT(ws.act.moe_stats().dropped, 0);
}

// ---- One expert is the dense MLP -----------------------------------------------------------------

// E = 1, K = 1: the router's softmax is exactly 1, so the branch is the dense MLP with the same
// weights. Not bitwise: the dense block sums the attention and MLP outputs inside one product
// (ag . [wo | w_down]) and d(h) over one [k v q gate up] product, where an MoE layer adds two
// separate products; the difference is rounding only (1e-12 relative in double, ~1e-5 in float).
template <typename S>
void one_expert_is_dense(double tol) {
  Config dense = testing::tiny_config();
  dense.z_loss = 1e-4;
  Config moe = dense;
  moe.experts = 1;
  moe.top_k = 1;
  moe.capacity_factor = 1.0;
  moe.aux_loss = 0.3;      // its gradient is exactly zero for E = 1 (p = 1 has no slope)
  moe.router_z_loss = 0;   // this one is not: logsumexp = the logit itself
  const ParamLayout ld(dense, 0, 1), lm(moe, 0, 1);
  std::vector<S> pd(static_cast<size_t>(ld.total())), pm(static_cast<size_t>(lm.total()));
  init_params(ld, 5, pd.data());
  init_params(lm, 5, pm.data());
  auto copy = [](const ParamLayout& from, const std::vector<S>& src, const std::string& a, const ParamLayout& to,
                 std::vector<S>& dst, const std::string& b, int64_t at = 0) {
    const ParamInfo& x = from.get(a);
    std::memcpy(&dst[static_cast<size_t>(to.get(b).offset + at)], &src[static_cast<size_t>(x.offset)], sizeof(S) * x.size);
  };
  for (const ParamInfo& p : lm.params())
    if (ld.find(p.name)) copy(ld, pd, p.name, lm, pm, p.name);
  for (int l = 0; l < 2; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    copy(ld, pd, pre + "w_gate", lm, pm, pre + "experts.w_gate_up");
    copy(ld, pd, pre + "w_up", lm, pm, pre + "experts.w_gate_up", dense.d_ff * dense.d_model);
    copy(ld, pd, pre + "w_down", lm, pm, pre + "experts.w_down");
  }
  const int64_t B = 2;
  const std::vector<int32_t> tokens = testing::random_tokens(dense, B, 9);
  Workspace<S> wd(ld, B), wm(lm, B);
  std::vector<S> gd(pd.size(), S(0)), gm(pm.size(), S(0));
  const S lossd = forward_backward<S>(ld, pd.data(), gd.data(), tokens.data(), B, S(1), wd, {});
  const S lossm = forward_backward<S>(lm, pm.data(), gm.data(), tokens.data(), B, S(1), wm, {});
  EXPECT_NEAR(lossm, lossd, tol * std::abs(lossd));
  EXPECT_EQ(wm.act.moe_stats().dropped, 0);
  auto compare = [&](const std::string& a, const std::string& b, int64_t at = 0) {
    const ParamInfo& x = ld.get(a);
    S mx = 0;
    for (int64_t i = 0; i < x.size; ++i) mx = std::max(mx, std::abs(gd[static_cast<size_t>(x.offset + i)]));
    for (int64_t i = 0; i < x.size; ++i)
      ASSERT_NEAR(gm[static_cast<size_t>(lm.get(b).offset + at + i)], gd[static_cast<size_t>(x.offset + i)], tol * mx)
          << a << "[" << i << "]";
  };
  for (const ParamInfo& p : ld.params())
    if (lm.find(p.name)) compare(p.name, p.name);
  for (int l = 0; l < 2; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    compare(pre + "w_gate", pre + "experts.w_gate_up");
    compare(pre + "w_up", pre + "experts.w_gate_up", dense.d_ff * dense.d_model);
    compare(pre + "w_down", pre + "experts.w_down");
  }
}
TEST(Moe, OneExpertIsTheDenseModelDouble) { one_expert_is_dense<double>(1e-12); }
TEST(Moe, OneExpertIsTheDenseModelFloat) { one_expert_is_dense<float>(2e-5); }

// ---- Dropless = a capacity that drops nothing ---------------------------------------------------

// Bitwise where the float GEMM's sums do not depend on the shape: the project's SGEMM sums each
// element in increasing k with one accumulator and never lets a row depend on the others, so the
// capacity's zero padding rows (at the end of each expert's block) change no bit. OpenBLAS and
// Eigen (the float GEMM on CPUs without AVX-512) split their sums by the product's M and K (a
// row's result changes with the number of rows, and zero rows appended to K move the pairing of
// its partial sums): there the test states the rounding bound instead.
TEST(Moe, DroplessEqualsLargeCapacity) {
  Config a = moe_config(4, 2, 0.0);
  a.d_model = 32;
  a.d_ff = 40;
  Config b = a;
  b.capacity_factor = 4.0;  // ceil(4 * 2 N / 4) = 2N rows per expert: nothing is dropped
  const ParamLayout la(a, 0, 1), lb(b, 0, 1);
  ASSERT_EQ(la.total(), lb.total());
  std::vector<float> params(static_cast<size_t>(la.total()));
  init_params(la, 4, params.data());
  const int64_t B = 3;
  const std::vector<int32_t> tokens = testing::random_tokens(a, B, 4);
  Workspace<float> wa(la, B), wb(lb, B);
  std::vector<float> ga(params.size(), 0.0f), gb(params.size(), 0.0f);
  const float loss_a = forward_backward<float>(la, params.data(), ga.data(), tokens.data(), B, 1.0f, wa, {});
  const float loss_b = forward_backward<float>(lb, params.data(), gb.data(), tokens.data(), B, 1.0f, wb, {});
  EXPECT_EQ(wb.act.moe_stats().dropped, 0);
  EXPECT_GT(wb.act.moe_stats().expert_rows, wa.act.moe_stats().expert_rows);  // padding computed
  const bool bitwise = gemm_backend() == GemmBackend::kAvx512;
  for (const ParamInfo& p : la.params()) {
    if (bitwise) {
      EXPECT_EQ(0, std::memcmp(&ga[static_cast<size_t>(p.offset)], &gb[static_cast<size_t>(p.offset)],
                               sizeof(float) * p.size))
          << p.name;
      continue;
    }
    float mx = 0;
    for (int64_t i = 0; i < p.size; ++i) mx = std::max(mx, std::abs(ga[static_cast<size_t>(p.offset + i)]));
    for (int64_t i = 0; i < p.size; ++i)
      ASSERT_NEAR(gb[static_cast<size_t>(p.offset + i)], ga[static_cast<size_t>(p.offset + i)], 1e-5f * mx) << p.name;
  }
  if (bitwise) {
    EXPECT_EQ(0, std::memcmp(&loss_a, &loss_b, sizeof(float)));
  } else {
    EXPECT_NEAR(loss_a, loss_b, 1e-6f * std::abs(loss_a));
  }
}

// ---- Expert parallelism: ranks as threads ---------------------------------------------------------

// P ranks in lockstep exchanging rows (an AllToAll): rank r's block for rank q is copied from r's
// send buffer into q's receive buffer, in rank order.
template <typename S>
class SimEpGroup {
 public:
  explicit SimEpGroup(int n) : n_(n), bar_(n), send_(n), send_rows_(n), counts_(n) {}
  ExpertComm<S> comm(int rank) {
    ExpertComm<S> ep;
    ep.size = n_;
    ep.counts = [this, rank](const int64_t* send, int64_t* recv, int64_t per) {
      counts_[rank] = send;
      bar_.arrive_and_wait();
      for (int p = 0; p < n_; ++p)
        for (int64_t j = 0; j < per; ++j) recv[p * per + j] = counts_[p][rank * per + j];
      bar_.arrive_and_wait();
    };
    ep.rows = [this, rank](const S* send, const int64_t* send_rows, S* recv, const int64_t* recv_rows, int64_t w) {
      send_[rank] = send;
      send_rows_[rank] = send_rows;
      bar_.arrive_and_wait();
      int64_t at = 0;
      for (int p = 0; p < n_; ++p) {
        int64_t off = 0;
        for (int q = 0; q < rank; ++q) off += send_rows_[p][q];
        PWM_CHECK_EQ(send_rows_[p][rank], recv_rows[p]);
        std::memcpy(recv + at * w, send_[p] + off * w, sizeof(S) * recv_rows[p] * w);
        at += recv_rows[p];
      }
      bar_.arrive_and_wait();
    };
    return ep;
  }
  void run(const std::function<void(int)>& fn) { testing::run_threads(n_, fn); }

 private:
  int n_;
  std::barrier<> bar_;
  std::vector<const S*> send_;
  std::vector<const int64_t*> send_rows_;
  std::vector<const int64_t*> counts_;
};

// Two data-parallel ranks, each with its own tokens: every rank holding all experts (gradients
// summed afterwards, as the dp AllReduce would) against the experts split over the two (P = 2).
// Losses bitwise (a row's products never depend on the other rows); the dense gradients bitwise
// (the same per-rank sums, added the same way); the experts' gradients within rounding: each
// expert now sums its rows from both ranks in one product per block, where P = 1 sums each rank's
// rows apart and adds the two.
template <typename S>
void expert_parallel_matches(double capacity, double tol) {
  Config c = moe_config(4, 2, capacity);
  c.d_model = 32;
  c.d_ff = 40;
  c.moe_every = 2;  // a dense layer between
  const int64_t B = 2;
  const int P = 2;
  const ParamLayout full(c, 0, 1);
  std::vector<S> params(static_cast<size_t>(full.total()));
  init_params(full, 8, params.data());
  std::vector<std::vector<int32_t>> tokens = {testing::random_tokens(c, B, 21), testing::random_tokens(c, B, 22)};
  // P = 1: each rank all experts.
  std::vector<S> g_ref(params.size(), S(0));
  std::vector<S> loss_ref(P);
  for (int r = 0; r < P; ++r) {
    Workspace<S> ws(full, B);
    std::vector<S> g(params.size(), S(0));
    loss_ref[r] = forward_backward<S>(full, params.data(), g.data(), tokens[r].data(), B, S(1), ws, {});
    for (size_t i = 0; i < g.size(); ++i) g_ref[i] += g[i];
  }
  // P = 2: rank r holds experts [2r, 2r + 2).
  SimEpGroup<S> group(P);
  std::vector<std::vector<S>> g_ep(P);
  std::vector<S> loss_ep(P);
  std::vector<ParamLayout> layouts;
  for (int r = 0; r < P; ++r) layouts.emplace_back(c, 0, 1, r, P);
  group.run([&](int r) {
    const ParamLayout& lay = layouts[static_cast<size_t>(r)];
    std::vector<S> mine(static_cast<size_t>(lay.total()));
    init_params(lay, 8, mine.data());
    Workspace<S> ws(lay, B);
    g_ep[r].assign(mine.size(), S(0));
    loss_ep[r] = forward_backward<S>(lay, mine.data(), g_ep[r].data(), tokens[r].data(), B, S(1), ws, {},
                                     group.comm(r));
  });
  for (int r = 0; r < P; ++r) EXPECT_EQ(0, std::memcmp(&loss_ep[r], &loss_ref[r], sizeof(S))) << "rank " << r;
  for (const ParamInfo& p : full.params()) {
    S mx = 0;
    for (int64_t i = 0; i < p.size; ++i) mx = std::max(mx, std::abs(g_ref[static_cast<size_t>(p.offset + i)]));
    for (int r = 0; r < P; ++r) {
      const ParamInfo& q = layouts[static_cast<size_t>(r)].get(p.name);
      for (int64_t i = 0; i < q.size; ++i) {
        const S want = g_ref[static_cast<size_t>(p.offset + q.full_offset + i)];
        S got = g_ep[r][static_cast<size_t>(q.offset + i)];
        if (!p.expert) got = g_ep[0][static_cast<size_t>(q.offset + i)] + g_ep[1][static_cast<size_t>(q.offset + i)];
        if (p.expert) {
          ASSERT_NEAR(got, want, tol * mx) << p.name << "[" << i << "] rank " << r;
        } else {
          ASSERT_EQ(0, std::memcmp(&got, &want, sizeof(S))) << p.name << "[" << i << "]";
        }
      }
    }
  }
}
TEST(Moe, ExpertParallelDroplessMatchesDouble) { expert_parallel_matches<double>(0.0, 1e-13); }
TEST(Moe, ExpertParallelCapacityMatchesDouble) { expert_parallel_matches<double>(1.0, 1e-13); }
TEST(Moe, ExpertParallelDroplessMatchesFloat) { expert_parallel_matches<float>(0.0, 1e-5); }
TEST(Moe, ExpertParallelCapacityMatchesFloat) { expert_parallel_matches<float>(1.25, 1e-5); }

// ---- Bad settings: one line each -----------------------------------------------------------------

TEST(Moe, BadSettingsAreOneLine) {
  auto message = [](Config c, int64_t tp = 1, int64_t ep = 1) -> std::string {
    try {
      c.validate_tp(tp, ep);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  Config c = moe_config(4, 1, 1.25);
  EXPECT_EQ(message(c), "");
  Config k = c;
  k.top_k = 5;
  EXPECT_NE(message(k).find("--top-k must be between 1 and --experts=4 (got 5)"), std::string::npos) << message(k);
  EXPECT_NE(message(c, 1, 3).find("--experts 4 is not divisible by --expert-parallel 3"), std::string::npos);
  Config cap = c;
  cap.capacity_factor = -1;
  EXPECT_NE(message(cap).find("--capacity-factor must be >= 0"), std::string::npos);
  Config every = c;
  every.moe_every = 0;
  EXPECT_NE(message(every).find("--moe-every must be >= 1"), std::string::npos);
  EXPECT_NE(message(c, 2).find("--experts with --tp 2"), std::string::npos);
  Config dense = testing::tiny_config();
  EXPECT_NE(message(dense, 1, 2).find("needs a Mixture-of-Experts model"), std::string::npos);
  for (const Config& bad : {k, cap, every}) EXPECT_EQ(message(bad).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace pwm::model
