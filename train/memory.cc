// The memory estimate (train/checks.h estimate_memory): what a compute rank allocates, from the
// configuration alone, before anything is allocated (check_memory refuses a run that cannot
// fit). Each term follows the buffer it counts; all in doubles, as floats (4 bytes), so that an
// absurd flag (--seq-len 1e9, --experts 1e6) gives a huge number, never an overflowed small one.
#include <algorithm>
#include <cmath>

#include "train/checks.h"
#include "train/figures.h"

namespace pwm::train {

namespace {

struct Shape {
  double C, L, H, D, F, V, T, tp, ep, E, K, Lm;  // Lm: the MoE layers
  explicit Shape(const TrainConfig& c)
      : C(c.model.d_model), L(c.model.n_layers), H(c.model.n_heads), D(c.model.head_dim), F(c.model.d_ff),
        V(c.model.vocab), T(c.model.seq_len), tp(c.mesh.tp), ep(c.mesh.ep), E(c.model.experts), K(c.model.top_k),
        Lm(c.model.moe() ? std::floor(L / std::max<int64_t>(c.model.moe_every, 1)) : 0) {}
  double Hs() const { return H / tp; }
  // model/params.cc's layout: the fused input rows (k, v, q, then gate and up in a dense layer)
  // and output rows (o, then down), split over tp except k and v; a MoE layer's router (every
  // expert, replicated) and its local experts' gate|up and down (over --expert-parallel).
  double dense_layer() const { return C + (2 * D + Hs() * D + 2 * F / tp) * C + (Hs() * D + F / tp) * C; }
  double moe_layer() const { return C + (2 * D + Hs() * D) * C + Hs() * D * C + E * C + (E / ep) * 3 * F * C; }
  double params() const { return V * C + (L - Lm) * dense_layer() + Lm * moe_layer() + C; }
  // The fused matrices' rows of a dense layer and of an MoE layer (attention only: its MLP is
  // the experts').
  double rin(bool moe) const { return 2 * D + Hs() * D + (moe ? 0 : 2 * F / tp); }
  double rout(bool moe) const { return Hs() * D + (moe ? 0 : F / tp); }
  // model::Activations::layer_elements for B sequences, N = B T rows.
  double layer_acts(double B, bool moe) const {
    const double N = B * T;
    return 2 * N + N * C + N * rin(moe) + N * Hs() * D + N * D + B * T * Hs() * T + N * rout(moe);
  }
  // model::Scratch: the backward's d(yin), d(ag), the tp reduction, d(logits), d(hf), one
  // sequence's attention temporaries.
  double scratch(double B) const {
    const double N = B * T;
    return N * (rin(false) + rout(false) + 2 * C + V) + 2 * D * C + T * Hs() * (T + 2 * D) + T * D;
  }
};

// One MoE layer's rows for N tokens of this rank: sent (the dispatched buffer, padding included)
// and received by the local experts. Under a capacity each expert takes ceil(cf K N / E) rows from
// each rank; dropless, a rank sends its N K choices and its experts may receive, at worst, every
// choice of the --expert-parallel group's ranks that can land on them (N min(K, El) from each).
void moe_rows(const TrainConfig& c, const Shape& s, double N, double& sent, double& recv) {
  const double El = s.E / s.ep;
  if (c.model.capacity_factor > 0) {
    const double cap = std::ceil(c.model.capacity_factor * s.K * N / s.E);
    sent = s.E * cap;
    recv = s.ep * El * cap;
  } else {
    sent = N * std::min(s.K, s.E);
    recv = s.ep * N * std::min(s.K, El);
  }
}

}  // namespace

MemoryEstimate estimate_memory(const TrainConfig& c, bool mpmd) {
  const Shape s(c);
  const double dp = std::max(1, c.mesh.dp), S = std::max(1, c.mpmd.stages);
  const double M = std::max<int64_t>(c.workload.microbatches, 1);
  const double B = static_cast<double>(c.workload.global_batch) / std::max(c.data_parallel(), 1) / M, N = B * s.T;
  MemoryEstimate e;
  // A pipeline's first stage computes the embedding and ceil(L / S) layers; its state arrays are
  // the whole layout's size (programs/step_io.cc state_floats).
  const double layers = std::ceil(s.L / S);
  const double stage_params = s.params();
  e.state = 4 * 4 * stage_params / (c.mesh.fsdp ? dp : 1);
  // --fsdp (train/fsdp.h): one gathered layer and one layer's gradient, the embedding and final
  // norm gathered for the step.
  if (c.mesh.fsdp) e.gathers = 4 * (2 * std::max(s.dense_layer(), s.moe_layer()) + s.V * s.C + s.C);
  // Saved per layer; x(l) for every layer and dx; the head's probabilities [N, V], normed x, its
  // statistics; the rope table.
  // A pipeline's first stage has no MoE layers (mpmd refuses MoE pipelines); else the model's.
  const double moe_layers = S > 1 ? 0 : s.Lm;
  const double saved = (layers - moe_layers) * s.layer_acts(B, false) + moe_layers * s.layer_acts(B, true);
  const double one = saved + (layers + 2) * N * s.C + N * s.V + N * s.C + 3 * N + s.T * s.D + s.scratch(B);
  e.activations = 4 * one;
  // A pipeline stage keeps the micro-batches its schedule holds between forward and backward
  // (programs/pipeline.cc stage_activations: all M under GPipe on stage 0, S under 1F1B).
  if (S > 1) {
    const double held = c.mpmd.schedule == Schedule::kGpipe ? M : std::min(M, S);
    e.in_flight = 4 * (held - 1) * (layers * s.layer_acts(B, false) + layers * N * s.C);
  }
  if (s.Lm > 0) {
    double sent = 0, recv = 0;
    moe_rows(c, s, N, sent, recv);
    // model/moe.h MoeState per MoE layer: probs [N, E], lse, choice/gate/slot/dgate [N, K] (slot
    // 8 bytes), xe [recv, C], ye [recv, 2F], ge [recv, F], back and dxback [sent, C]; MoeScratch
    // once: logits and dlogits [N, E], sent and dback [sent, C], the experts' backward rows.
    const double layer = N * s.E + N + 5 * N * s.K + recv * (s.C + 3 * s.F) + 2 * sent * s.C;
    const double scratch = 2 * N * s.E + 2 * sent * s.C + recv * (s.C + 3 * s.F);
    e.moe = 4 * (s.Lm * layer + scratch);
    // The MPMD runtimes' own (issue 58). The step donates its state, updated in place as
    // spmd_train's (docs/dataflow.md, "Donation"), so a fused step holds what spmd_train holds,
    // and a traced step's values between its kernels are the activations a workspace holds in
    // spmd_train (counted once above). Beyond them, the blocks' rows cross between a traced MoE
    // layer's kernels as values beside the device's MoE state: the dispatched and the received
    // rows [sent + recv, C] forward and their gradients backward. (Measured, compare.sh --moe at
    // skew 0, 2026-12-07: pw_static 36 MiB above spmd_train under the capacity, this term 20 MiB;
    // pw_controller 38 above dropless, this 24 at its worst case of received rows; the rest is
    // unattributed, 20% and 10% of their peaks against spmd_train's 17% and 7%. Counting the MoE
    // rows once more, as before, put the unattributed part at -20 to -109 MiB.)
    if (mpmd && c.mpmd.granularity != Granularity::kFused) e.runtime = 4 * s.Lm * 2 * (sent + recv) * s.C;
  }
  return e;
}

double estimated_memory_bytes(const TrainConfig& cfg, bool mpmd) { return estimate_memory(cfg, mpmd).total(); }

void report_memory_estimate(const TrainConfig& cfg, bool mpmd, RunFigures& f) {
  const MemoryEstimate e = estimate_memory(cfg, mpmd);
  f.memory_estimate_bytes = e.total();
  f.memory_activations_bytes = e.activations;
  f.memory_in_flight_bytes = e.in_flight;
  f.memory_moe_bytes = e.moe;
  f.memory_gathers_bytes = e.gathers;
  f.memory_runtime_bytes = e.runtime;
}

}  // namespace pwm::train
