// The replicas' step program: one slice per island, the cross-island gradient exchange as
// worker-to-worker transfers inside the program (docs/pathways_train.md, "Replicas").
//
// Why the exchange is nodes and edges rather than a collective: a slice's collectives stay inside
// its island (the resource manager never makes a slice span islands), and the paper moves the
// gradients between the pods over the DCN as the program's own transfers. An edge from island
// r's piece to island q's replica_add is lowered to one send per device (shard k to shard k): the
// worker posts it as soon as the piece's producer ends, so in chained granularity the transfer
// of layer l's gradient runs while the island computes the backward of layers l-1..0.
#include <fmt/format.h>

#include "common/check.h"
#include "pathways/train/step_program.h"

namespace pwm::pathways::train {

using model::StepPlan;
using pwm::train::Granularity;

Program replica_program(const Shapes& sh, const KernelNames& names, Granularity granularity,
                        const std::vector<Slice>& slices, const std::vector<State<Array>>& states) {
  const int R = static_cast<int>(slices.size());
  const pwm::train::TrainConfig& cfg = sh.cfg();
  PWM_CHECK(R == cfg.mesh.replicas && R > 1 && states.size() == slices.size(), "replica_program: {} slices for {} replicas",
            R, cfg.mesh.replicas);
  const int tp = cfg.mesh.tp;
  const StepPlan& plan = sh.plan(tp);
  const int P = plan.num_pieces();
  ProgramBuilder b(fmt::format("replicas-{}-R{}", pwm::train::name(granularity), R));
  std::vector<State<Value>> st;
  for (const auto& a : states) {
    std::vector<Value> v;
    for (const Array& x : a.list()) v.push_back(b.param_like(x));
    st.push_back(State<Value>::from(v));
  }
  // Each island's step: its gradient pieces, reduced over the island's dp group, and its loss.
  std::vector<std::vector<Value>> pieces(R);
  std::vector<Value> loss(R);
  // recv[r][q][i]: island q's piece i as received on island r (early exchange only).
  std::vector<std::vector<std::vector<Value>>> recv(R, std::vector<std::vector<Value>>(R, std::vector<Value>(static_cast<size_t>(P))));
  // Early exchange (chained, dp = tp = 1): a worker visits its instruction list in program order
  // and goes back to the top after every kernel, so a send placed where its consumer is (after
  // the whole backward, for replica_add) would be posted only when the backward is over. Each
  // final piece is therefore forwarded at once: right after the node that finishes it, one
  // replica_fwd node (a copy) on every other island consumes it, so the send sits right after
  // the producer in the sender's list. Not with dp or tp > 1: a gang node (the dp reduction,
  // the tp blocks) waits for every lower-numbered node of its worker, which the forwarded nodes
  // of an island traced earlier would be, serializing that island behind the other's backward.
  const bool early = granularity == Granularity::kChained && cfg.mesh.dp == 1 && cfg.mesh.tp == 1;
  const int64_t M = plan.microbatches();
  for (int r = 0; r < R; ++r) {
    const Slice& sl = slices[static_cast<size_t>(r)];
    if (granularity == Granularity::kFused) {
      auto o = b.call(names("fused_grads"), sl, st[r].list(), {tp, r});
      PWM_CHECK_EQ(static_cast<int>(o.size()), P + 1);
      pieces[r].assign(o.begin(), o.begin() + P);
      loss[r] = o[static_cast<size_t>(P)];
      continue;
    }
    PWM_CHECK(granularity == Granularity::kChained, "replicas run fused or chained, not {}", pwm::train::name(granularity));
    std::vector<int64_t> seen(static_cast<size_t>(P), 0);  // backward units per piece so far
    const CallFn<Value> call = [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      auto out = b.call(k, sl, in, at);
      if (!early) return out;
      int piece = -1;
      size_t idx = 0;
      if (k.rfind(names("block_bwd"), 0) == 0) {
        piece = StepPlan::layer_piece(static_cast<int>(at[1]));
        idx = kBwdGrad;
      } else if (k == names("embed_bwd")) {
        piece = StepPlan::kTiedPiece;
      }
      if (piece >= 0 && ++seen[static_cast<size_t>(piece)] == M)  // the last micro-batch's: final
        for (int q = 0; q < R; ++q)
          if (q != r)
            recv[q][r][static_cast<size_t>(piece)] =
                b.call(names("replica_fwd"), slices[static_cast<size_t>(q)], {out[idx]}, {tp, sh.piece(tp, piece)})[0];
      return out;
    };
    Grads<Value> g = trace_grads(sh, names, tp, st[r], call, r);
    for (int i = 0; i < P; ++i) {
      Value& p = g.pieces[static_cast<size_t>(i)];
      // dp = 1: the island's piece is the device's own (no node: a copy would be the only work).
      pieces[r].push_back(cfg.mesh.dp > 1 ? b.call(names("dp_allreduce"), sl, {p}, {tp, sh.piece(tp, i)})[0] : p);
    }
    loss[r] = b.call(names("island_loss"), sl, g.losses, {tp, static_cast<int64_t>(g.losses.size())})[0];
  }
  // The exchange: on every island, each piece summed over the islands in island order (the same
  // inputs in the same order everywhere: the same bits everywhere). Pieces in the order the
  // backward finishes them (the last layer first, the tied embedding last), after every island's
  // backward in program order: a worker's nodes of higher priority are its own backward units;
  // the transfers are posted when each piece exists, whatever the node order.
  std::vector<int> order;
  for (int l = static_cast<int>(cfg.model.n_layers) - 1; l >= 0; --l) order.push_back(StepPlan::layer_piece(l));
  order.push_back(StepPlan::kTiedPiece);
  PWM_CHECK_EQ(static_cast<int>(order.size()), P);
  for (int r = 0; r < R; ++r) {
    std::vector<Value> sum(static_cast<size_t>(P));
    for (int i : order) {
      std::vector<Value> in;
      for (int q = 0; q < R; ++q)
        in.push_back(early && q != r ? recv[r][q][static_cast<size_t>(i)] : pieces[q][static_cast<size_t>(i)]);
      sum[static_cast<size_t>(i)] = b.call(names("replica_add"), slices[static_cast<size_t>(r)], in, {tp, sh.piece(tp, i), R})[0];
    }
    for (auto& v : b.call(names("replica_update"), slices[static_cast<size_t>(r)],
                          replica_update_args(sh, tp).pack<Value>(st[r], nullptr, sum, loss), {tp}))
      b.output(v);
  }
  return b.build();
}

}  // namespace pwm::pathways::train
