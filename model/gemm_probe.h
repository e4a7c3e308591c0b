// The matrix products of one training step, and a probe of the rate this process runs them at:
// the GEMM peak MFU is measured against (docs/train.md, "MFU").
//
// A 1024^3 SGEMM is not the model's work: the step's products are [N, C] x [C, R_in] and their
// transposes, the attention's per-sequence causal blocks, the head's [N, V] (and an MoE layer's
// experts), and on a shared core their rate moves away from the 1024^3 one in both directions.
// So the probe times the step's own products - the shapes, leading dimensions, transposes and
// beta of transformer_block.cc, transformer.cc and moe.cc, through the same gemm<float> at the
// process's precision - and reports their rate as the step would see it:
//   rate = sum_i count_i flops_i / sum_i count_i best_i
// over the distinct products i (count_i: how often one micro-batch's forward and backward calls
// it; best_i: its fastest time in any probe so far). A probe visits the products in turn and
// stops after a time budget, so that probing through a run costs a few tens of ms each time; the
// rate is the highest the process has shown on each product, a peak in the sense MFU needs.
//
// It is not a bound on the step's model FLOP rate: PaLM's FLOPs count the full attention
// matrix where the causal blocks skip part of it, and bf16 products whose operands the backward
// holds (Bf16Hold) skip the rounding the probe pays. A trainer therefore also raises its peak to
// any step's achieved rate that exceeds it (train/peak.h).
//
// Shapes use the glossary of config.h; N = B*T rows of one micro-batch. No MPI, one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/params.h"

namespace pwm::model {

// One product C[M,N] = op(A) op(B) + beta C of the step, as gemm<float> is called for it.
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float beta = 0;      // 0 or 1 (the weight gradients accumulate)
  int64_t count = 0;   // calls of this exact product per micro-batch (forward and backward)
  std::string what;    // "w_in fwd", "attn scores", "head d(E)", ... (its first occurrence)
  double flops() const { return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K); }
};

// The products one micro-batch of B sequences calls on one rank of `layout` (its tp shard,
// every layer, the head): forward, then backward, in the order of first use, identical products
// merged into one entry with its count. An MoE layer's experts: under a capacity, E blocks of
// expert_capacity(N) rows each (P x E/P blocks on an expert-parallel rank, as moe.cc runs
// them); dropless, E blocks that share the N K routed rows as evenly as possible (the real
// split depends on the routing: the FLOPs are exact for P = 1, the expected ones for P > 1).
std::vector<GemmCall> step_gemm_calls(const ParamLayout& layout, int64_t B);
// sum_i count_i flops_i: one micro-batch's matrix-product FLOPs on one rank.
double gemm_flops(const std::vector<GemmCall>& calls);

// The probe over one rank's step (above). Owns operand buffers as large as the step's largest
// A, B and C (about two [N, R_in] matrices: one layer's largest activations), filled once with
// values in [-1, 1]; their results are never read.
class GemmProbe {
 public:
  GemmProbe(const ParamLayout& layout, int64_t B);

  const std::vector<GemmCall>& calls() const { return calls_; }
  double step_flops() const { return flops_; }  // gemm_flops(calls())

  // Times the products one after another, starting where the previous probe stopped, until
  // `budget_s` seconds have passed (at least one product); with budget_s <= 0, or before every
  // product has been timed once, until every product has been. Returns gflops().
  double run(double budget_s);
  // The step's products at their best times so far (above), GFLOP/s; 0 before the first run.
  double gflops() const;
  int probes() const { return probes_; }  // run() calls so far

 private:
  std::vector<GemmCall> calls_;
  std::vector<double> best_s_;  // per call; +inf until timed
  std::vector<float> a_, b_, c_;
  double flops_ = 0;
  size_t next_ = 0;   // the call the next probe starts at
  size_t timed_ = 0;  // calls timed at least once
  int probes_ = 0;
};

}  // namespace pwm::model
