// The replicas' step traced as a program: one slice per replica (pathways: per island), the
// cross-replica gradient exchange as device-to-device transfers inside the program
// (docs/pathways_train.md, "Replicas"; both MPMD models run it).
//
// Why the exchange is nodes and edges rather than a collective: a slice's collectives stay inside
// its island (the resource manager never makes a slice span islands), and the paper moves the
// gradients between the pods over the DCN as the program's own transfers. An edge from island
// r's piece to island q's replica_add is lowered to one send per device (shard k to shard k): the
// device posts it as soon as the piece's producer ends (wherever the send sits in its list), so in
// chained granularity the transfer of layer l's gradient runs while the island computes the
// backward of layers l-1..0.
//
// With dp = D > 1 devices per island, what crosses is 1/D of each piece per device, as PaLM's
// (and spmd_train's hierarchical) exchange: the island's sum is a ReduceScatter (dp_reduce_scatter;
// fused: fused_grads' outputs are the device's chunk of the summed pieces), device k of each
// island sends its chunk k to device k of the others, replica_add sums the chunks, and
// dp_allgather makes each piece whole on every device for the update.
#include <fmt/format.h>

#include "programs/replicas.h"

#include "common/check.h"
#include "programs/trace.h"

namespace pwm::programs {

using dataflow::Value;
using model::StepPlan;
using pwm::train::Granularity;

namespace {

// --fsdp at chained: island r's step as the single-island chained step traces it (the layers'
// gathers and reduce-scatters as nodes: their chunks exist as each layer's backward ends), the
// tied piece cut into its chunks; each chunk, this device's 1/D of its piece, is exchanged as
// itself (no island sum is left to do) and replica_update takes the summed chunks in shard order.
void fsdp_chained(const SliceCall& b_call, std::vector<Value>& out, const Shapes& sh, const KernelNames& names,
                  const std::vector<State<Value>>& st, int64_t* fsdp_held) {
  const int R = static_cast<int>(st.size()), tp = sh.cfg().mesh.tp;
  const int L = static_cast<int>(sh.cfg().model.n_layers);
  std::vector<std::vector<Value>> chunks(static_cast<size_t>(R));  // per island, in shard order
  std::vector<Value> loss(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    const CallFn<Value> call = [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      return b_call(r, k, std::move(in), std::move(at));
    };
    Grads<Value> g = trace_grads(sh, names, tp, st[static_cast<size_t>(r)], call, r);
    if (fsdp_held != nullptr) *fsdp_held = g.fsdp_held;
    auto tied = call(names("tied_reduce_scatter"), {g.pieces[StepPlan::kTiedPiece]}, {tp});
    auto& c = chunks[static_cast<size_t>(r)];
    c.push_back(tied[0]);
    for (int l = 0; l < L; ++l) c.push_back(g.pieces[static_cast<size_t>(StepPlan::layer_piece(l))]);
    c.push_back(tied[1]);
    loss[static_cast<size_t>(r)] =
        call(names("island_loss"), g.losses, {tp, static_cast<int64_t>(g.losses.size())})[0];
  }
  // As the plain replicas' exchange: the chunks in the order the backward finishes them (the
  // last layer first, the tied pieces last), summed in island order on every island.
  std::vector<int> order;
  for (int l = L - 1; l >= 0; --l) order.push_back(1 + l);
  order.push_back(0);
  order.push_back(L + 1);
  for (int r = 0; r < R; ++r) {
    std::vector<Value> sum(static_cast<size_t>(L + 2));
    for (int i : order) {
      std::vector<Value> in;
      for (int q = 0; q < R; ++q) in.push_back(chunks[static_cast<size_t>(q)][static_cast<size_t>(i)]);
      sum[static_cast<size_t>(i)] =
          b_call(r, names("replica_add"), in, replica_add_attrs(tp, sh.fsdp_chunk(tp, i), R, r))[0];
    }
    for (auto& v : b_call(r, names("replica_update"),
                          replica_update_args(sh, tp, true).pack<Value>(st[static_cast<size_t>(r)], nullptr, sum, loss),
                          {tp, 1}))
      out.push_back(v);
  }
}

}  // namespace

std::string replica_name(Granularity granularity, int replicas) {
  return fmt::format("replicas-{}-R{}", pwm::train::name(granularity), replicas);
}

std::vector<Value> trace_replica_step(const Shapes& sh, const KernelNames& names, Granularity granularity,
                                      const std::vector<State<Value>>& st, const SliceCall& slice_call, int64_t* fsdp_held) {
  const int R = static_cast<int>(st.size());
  const pwm::train::TrainConfig& cfg = sh.cfg();
  PWM_CHECK(R == cfg.mesh.replicas && R > 1, "trace_replica_step: {} slices for {} replicas", R, cfg.mesh.replicas);
  std::vector<Value> out;
  const int tp = cfg.mesh.tp;
  const StepPlan& plan = sh.plan(tp);
  const int P = plan.num_pieces();
  if (cfg.mesh.fsdp && granularity == Granularity::kChained) {
    fsdp_chained(slice_call, out, sh, names, st, fsdp_held);
    return out;
  }
  // Each island's step: its gradient pieces, reduced over the island's dp group (D > 1: this
  // device's chunk of the sum), and its loss.
  std::vector<std::vector<Value>> pieces(R, std::vector<Value>(static_cast<size_t>(P)));
  std::vector<Value> loss(R);
  const int64_t M = plan.microbatches();
  const int D = cfg.mesh.dp;
  // What a device exchanges of piece i: the piece, or its chunk (D > 1).
  const auto xchg_size = [&](int i) { return static_cast<int64_t>(replica_chunk(sh.piece(tp, i), D)); };
  for (int r = 0; r < R; ++r) {
    if (granularity == Granularity::kFused && cfg.mesh.fsdp) {  // one piece: the gradient shard
      auto o = slice_call(r, names("shard_grads"), st[r].list(), {tp, r});
      pieces[r] = {o[0]};
      loss[r] = o[1];
      continue;
    }
    if (granularity == Granularity::kFused) {
      auto o = slice_call(r, names("fused_grads"), st[r].list(), {tp, r, D});
      PWM_CHECK_EQ(static_cast<int>(o.size()), P + 1);
      pieces[r].assign(o.begin(), o.begin() + P);
      loss[r] = o[static_cast<size_t>(P)];
      continue;
    }
    PWM_CHECK(granularity == Granularity::kChained, "replicas run fused or chained, not {}", pwm::train::name(granularity));
    // A piece is final after its last micro-batch's backward unit (block_bwd(l); embed_bwd for
    // the tied piece). Its island sum (D > 1) is the next node of the island, so that the chunk
    // exists, and its sends leave (the worker posts a ready send wherever it sits in the list),
    // while the island computes the backward of the layers below: the exchange overlaps the
    // backward at every D and T. A blocking ReduceScatter inside the island between two
    // backward units; the slow link is the one it hides.
    std::vector<int64_t> seen(static_cast<size_t>(P), 0);  // backward units per piece so far
    const CallFn<Value> call = [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      auto res = slice_call(r, k, std::move(in), at);
      int piece = -1;
      size_t idx = 0;
      if (k.rfind(names("block_bwd"), 0) == 0) {
        piece = StepPlan::layer_piece(static_cast<int>(at[1]));
        idx = kBwdGrad;
      } else if (k == names("embed_bwd")) {
        piece = StepPlan::kTiedPiece;
      }
      if (piece >= 0 && ++seen[static_cast<size_t>(piece)] == M) {
        const Value& g = res[idx];
        pieces[r][static_cast<size_t>(piece)] =
            D > 1 ? slice_call(r, names("dp_reduce_scatter"), {g}, {tp, sh.piece(tp, piece), D})[0] : g;
      }
      return res;
    };
    Grads<Value> g = trace_grads(sh, names, tp, st[r], call, r);
    for (int i = 0; i < P; ++i)
      PWM_CHECK(pieces[r][static_cast<size_t>(i)].id().node >= 0, "trace_replica_step: piece {} never finished", i);
    loss[r] = slice_call(r, names("island_loss"), g.losses, {tp, static_cast<int64_t>(g.losses.size())})[0];
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
  if (cfg.mesh.fsdp) {
    // --fsdp: device k's gradient shard is what it exchanges (its 1/D); summed, it is the update's.
    for (int r = 0; r < R; ++r) {
      std::vector<Value> in;
      for (int q = 0; q < R; ++q) in.push_back(pieces[q][0]);
      Value s = slice_call(r, names("replica_add"), in, replica_add_attrs(tp, sh.state_floats(tp), R, r))[0];
      for (auto& v : slice_call(r, names("replica_update"), replica_update_args(sh, tp).pack<Value>(st[r], nullptr, {s}, loss),
                                {tp}))
        out.push_back(v);
    }
    return out;
  }
  for (int r = 0; r < R; ++r) {
    std::vector<Value> sum(static_cast<size_t>(P));
    for (int i : order) {
      std::vector<Value> in;
      for (int q = 0; q < R; ++q) in.push_back(pieces[q][static_cast<size_t>(i)]);
      Value s = slice_call(r, names("replica_add"), in, replica_add_attrs(tp, xchg_size(i), R, r))[0];
      sum[static_cast<size_t>(i)] = D > 1 ? slice_call(r, names("dp_allgather"), {s}, {tp, sh.piece(tp, i), D})[0] : s;
    }
    for (auto& v : slice_call(r, names("replica_update"), replica_update_args(sh, tp).pack<Value>(st[r], nullptr, sum, loss),
                              {tp}))
      out.push_back(v);
  }
  return out;
}

}  // namespace pwm::programs
