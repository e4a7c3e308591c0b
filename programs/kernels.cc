// The training kernels' registration: each kernel's name, signature (from the workload's
// shapes) and whether it is gang-scheduled; and the DeviceSet the registered kernels run on. The
// kernel bodies: state_kernels.cc (between steps), step_kernels*.cc, pipeline_kernels.cc,
// island_kernels.cc.
#include "programs/kernels.h"

#include "collectives/communicator.h"
#include "common/check.h"
#include "dataflow/kernel.h"

namespace pwm::programs {

DeviceSet::Attached DeviceSet::attach(std::shared_ptr<collectives::Transport> transport,
                                     std::shared_ptr<const pwm::train::TextDataset> data) {
  std::lock_guard<std::mutex> lock(mu_);
  const int rank = transport->rank();
  PWM_CHECK(!devices_.count(rank), "world rank {} already has a training device", rank);
  devices_[rank] = std::make_unique<TrainingDevice>(shapes_, std::move(transport), std::move(data));
  return Attached(this, rank);
}

void DeviceSet::detach(int world_rank) {
  std::unique_ptr<TrainingDevice> gone;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(world_rank);
  if (it == devices_.end()) return;
  gone = std::move(it->second);
  devices_.erase(it);
}

void DeviceSet::set_replicas(int replicas) {
  std::lock_guard<std::mutex> lock(mu_);
  pwm::train::TrainConfig cfg = shapes_.cfg();
  cfg.mesh.replicas = replicas;
  shapes_ = Shapes(cfg, shapes_.pipe());  // (in place: the kernels and devices hold its address)
  for (auto& [rank, dev] : devices_) dev->reshaped();
}

TrainingDevice& DeviceSet::at(int world_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(world_rank);
  PWM_CHECK(it != devices_.end(), "world rank {} runs a training kernel but has no training device", world_rank);
  return *it->second;
}

namespace {

Signature sig(std::vector<ArgSpec> in, std::vector<ArgSpec> out) {
  Signature s;
  s.inputs = std::move(in);
  s.outputs = std::move(out);
  return s;
}

// A state update's signature (inputs and outputs begin with the state, kParams .. kStep): the
// next parameters and AdamW moments may be written over the ones read (Signature::reuse), as
// spmd_train updates in place, when the caller donates its state (the trainer's step: element
// i is read before it is written, and a skipped step's pass-through copies nothing onto itself).
Signature in_place(Signature s) {
  s.reuse.assign(s.outputs.size(), -1);
  for (size_t i : {kParams, kAdamM, kAdamV}) s.reuse[i] = static_cast<int32_t>(i);
  return s;
}

using Body = void (*)(TrainingDevice&, KernelContext&, Scope&);
using Attrs = std::span<const int64_t>;

// Evaluation, checkpoints, hashing, merging, the GEMM peak probe and set-up run between steps:
// their time is not a step's busy time.
bool counts_as_step_work(const std::string& k) {
  for (const char* n : {"init", "load", "copy_state", "eval", "val_total", "memory", "hash", "save", "merge", "expert_pack",
                        "expert_merge", "gemm_probe"})
    if (k == n) return false;
  return true;
}

}  // namespace

namespace {

// Adds kernel `k` (registered as names(k)) to the process's registry, run on the device of the
// rank that executes it.
using AddFn = std::function<void(const std::string& k, bool collectives, std::function<Signature(Attrs)> sigfn, Body body)>;

// The kernels' signatures, from the workload's shapes. attrs[0] = tp everywhere; [1] = the
// layer, micro-batch, stage, size or count where noted.
int tp_of(Attrs a) { return static_cast<int>(a[0]); }
// A step's outputs: the next state and the step's statistics.
std::vector<ArgSpec> state_out(const Shapes* S, Attrs a) {
  auto out = S->state(tp_of(a));
  out.push_back(split_f64(S->stats_words()));
  return out;
}
ArgSpec piece(const Shapes* S, int tp, int p) { return split_f32(S->piece(tp, p)); }
ArgSpec tied(const Shapes* S, int tp) { return piece(S, tp, model::StepPlan::kTiedPiece); }
// A pipeline stage's gradient pieces: the tied piece, then its layers'.
std::vector<ArgSpec> stage_pieces(const Shapes* S, int tp, int stage) {
  const StageLayers sl = stage_layers(*S, stage);
  std::vector<ArgSpec> in{piece(S, tp, model::StepPlan::kTiedPiece)};
  for (int l = sl.begin; l < sl.end; ++l) in.push_back(piece(S, tp, model::StepPlan::layer_piece(l)));
  return in;
}

// An update of a whole slice's pieces (update, replica_update): the inputs in `args`' order
// (step_io.h: state, pieces 0..n-1, losses), the next state and the statistics out.
Signature update_sig(const Shapes* S, Attrs a, const UpdateArgs& args) {
  const int tp = tp_of(a);
  std::vector<ArgSpec> pieces, losses(args.losses, split_f64(1));
  // (--fsdp: the replicas' one piece, the gradient shard, or its chunks in shard order.)
  const bool fsdp = S->cfg().mesh.fsdp, chunks = args.pieces > 1;
  for (size_t i = 0; i < args.pieces; ++i)
    pieces.push_back(!fsdp   ? piece(S, tp, static_cast<int>(i))
                     : chunks ? split_f32(S->fsdp_chunk(tp, static_cast<int>(i)))
                              : split_f32(S->state_floats(tp)));
  return sig(args.pack<ArgSpec>(State<ArgSpec>::from(S->state(tp)), nullptr, pieces, losses), state_out(S, a));
}

// Set-up, the fused step, evaluation, checkpoints, hashing and memory.
void add_state_kernels(const AddFn& add, const Shapes* S) {
  using namespace kernels;
  // With --fsdp the state kernels make the device's Fsdp over the dp communicator: gang-scheduled.
  const bool fsdp = S->cfg().mesh.fsdp;
  add("init", fsdp, [S](Attrs a) { return sig({}, S->state(tp_of(a))); }, init_state);
  add("load", fsdp, [S](Attrs a) { return sig({}, S->state(tp_of(a))); }, load_state);
  add("copy_state", false, [S](Attrs a) { return sig(S->state(tp_of(a)), S->state(tp_of(a))); }, copy_state);
  add("fused_step", true, [S](Attrs a) { return in_place(sig(S->state(tp_of(a)), state_out(S, a))); },
      fused_step);
  add("eval", true, [S](Attrs a) { return sig({split_f32(S->state_floats(tp_of(a)))}, {split_f64(1)}); }, evaluate);
  add("val_total", false, [](Attrs a) {
    return sig(std::vector<ArgSpec>(static_cast<size_t>(a[1]), split_f64(1)), {split_f64(1)});
  }, val_total);
  add("memory", false, [](Attrs) { return sig({}, {ArgSpec{TensorSpec{DataType::kInt64, {2}}, Sharding::kSplit}}); },
      memory);
  add("gemm_probe", false, [](Attrs) { return sig({}, {split_f64(1)}); }, gemm_probe);
  add("hash", true, [S](Attrs a) {
    return sig({split_f32(S->state_floats(tp_of(a)))}, {ArgSpec{TensorSpec{DataType::kInt64, {1}}, Sharding::kSplit}});
  }, weights_hash);
  add("save", true, [S](Attrs a) { return sig(S->state(tp_of(a)), {rep_i64(1)}); }, save_state);
}

// --fsdp: what fsdp_gather returns for the tied pieces, which the device holds (step_kernels_fsdp.cc).
ArgSpec fsdp_tied_marker() { return ArgSpec{TensorSpec{DataType::kInt64, {1}}, Sharding::kSplit}; }

// A layer's block (attrs: tp, layer[, 1: the controller's counts are input 2]).
std::function<Signature(Attrs)> block_fwd_sig(const Shapes* S) {
  return [S](Attrs a) {
    const int tp = tp_of(a);
    // (--fsdp: input 0 is the layer's gathered weights, fsdp_gather's output.)
    const int64_t w = S->cfg().mesh.fsdp ? S->fsdp_gathered_layer(tp, static_cast<int>(a[1])) : S->state_floats(tp);
    std::vector<ArgSpec> in{split_f32(w), split_f32(S->act())};
    if (a.size() > 2 && a[2] != 0) in.push_back(S->route_counts());  // the controller's counts
    return sig(in, {split_f32(S->act()), split_f32(S->saved(tp))});
  };
}
std::function<Signature(Attrs)> block_bwd_sig(const Shapes* S, bool acc) {
  return [S, acc](Attrs a) {
    const int tp = tp_of(a);
    // (--fsdp: input 0 is the layer's gathered weights, and the output the micro-batch's full
    // layer gradient, padded as a gathered layer, which fsdp_rs_* reduce-scatter; no _acc form.)
    const int l = static_cast<int>(a[1]);
    const bool fsdp = S->cfg().mesh.fsdp;
    const ArgSpec g = fsdp ? split_f32(S->fsdp_gathered_layer(tp, l)) : piece(S, tp, model::StepPlan::layer_piece(l));
    std::vector<ArgSpec> in = {split_f32(fsdp ? S->fsdp_gathered_layer(tp, l) : S->state_floats(tp)),
                               split_f32(S->saved(tp)), split_f32(S->act()), split_f32(S->act())};
    if (acc) in.push_back(g);
    return sig(in, {split_f32(S->act()), g});
  };
}

// One kernel per plan unit kind (names: KernelNames::unit), the dp reductions and the update.
void add_unit_kernels(const AddFn& add, const Shapes* S) {
  using namespace kernels;
  add("batch", false, [S](Attrs) { return sig({rep_i64(1)}, {split_i32(S->tokens())}); }, batch);
  // --fsdp: the kernels that read weights take them gathered (fsdp_gather's output: input 0 of
  // embed_fwd and head the tied pieces', of block_fwd and block_bwd the layer's), and the block
  // backward returns the full layer gradient; the collectives are nodes of their own (below).
  const bool fsdp = S->cfg().mesh.fsdp;
  const auto weights = [S, fsdp](int tp) { return fsdp ? fsdp_tied_marker() : split_f32(S->state_floats(tp)); };
  add("embed_fwd", false, [S, weights](Attrs a) {
    return sig({weights(tp_of(a)), split_i32(S->tokens())}, {split_f32(S->act())});
  }, embed_fwd);
  for (bool coll : {false, true}) {
    const std::string sfx = coll ? "_tp" : "";
    add("block_fwd" + sfx, coll, block_fwd_sig(S), block_fwd);
    for (bool acc : {false, true})
      add("block_bwd" + sfx + (acc ? "_acc" : ""), coll, block_bwd_sig(S, acc), block_bwd);
  }
  // An MoE layer with --expert-parallel: the same kernels with the experts' AllToAll inside
  // (gang-scheduled); and the router's counts ahead of the layer (--moe-routing controller).
  add("block_fwd_ep", true, block_fwd_sig(S), block_fwd);
  for (bool acc : {false, true}) add(acc ? "block_bwd_ep_acc" : "block_bwd_ep", true, block_bwd_sig(S, acc), block_bwd);
  add("moe_counts", false, [S](Attrs a) {
    return sig({split_f32(S->total(tp_of(a))), split_f32(S->act())},
               {ArgSpec{TensorSpec{DataType::kInt64, {S->cfg().model.experts}}, Sharding::kSplit}});
  }, moe_counts);
  for (bool acc : {false, true})
    add(acc ? "head_acc" : "head", false, [S, acc, weights](Attrs a) {
      const int tp = tp_of(a);
      std::vector<ArgSpec> in = {weights(tp), split_f32(S->act()), split_i32(S->tokens())};
      if (acc) in.push_back(tied(S, tp));
      return sig(in, {split_f64(1), split_f32(S->act()), tied(S, tp)});
    }, head);
  add("embed_bwd", false, [S](Attrs a) {
    return sig({split_i32(S->tokens()), split_f32(S->act()), tied(S, tp_of(a))}, {tied(S, tp_of(a))});
  }, embed_bwd);
  add("dp_allreduce", true, [](Attrs a) { return sig({split_f32(a[1])}, {split_f32(a[1])}); }, dp_allreduce);
  // Its non-blocking form (attrs: tp, size, layer): start, then finish (device.h, start_reduce).
  add("dp_reduce_start", true, [](Attrs a) { return sig({split_f32(a[1])}, {split_f32(a[1])}); }, dp_reduce_start);
  add("dp_reduce_finish", true, [](Attrs a) {
    return sig({split_f32(a[1]), split_f32(a[1])}, {split_f32(a[1])});
  }, dp_reduce_finish);
  // The update's inputs in update_args()'s order (step_io.h): state, pieces, losses.
  // --expert-island (attrs[1] = 1): then each experts' device's squared norm; one more output, the
  // loss and squared norm its update reads (step_kernels_units.cc).
  add("update", true, [S](Attrs a) {
    Signature s = in_place(update_sig(S, a, update_args(*S, tp_of(a))));
    if (a.size() > 1 && a[1] != 0) {
      int64_t n = 0;  // (expert_sqnorm's: one per expert parameter)
      for (const model::ParamInfo& q : S->layout(1).params()) n += q.expert ? 1 : 0;
      s.inputs.insert(s.inputs.end(), static_cast<size_t>(S->cfg().mesh.ep), rep_f64(n));
      s.outputs.push_back(split_f64(2));
    }
    return s;
  }, update);
  // --fsdp (chained, opbyop; attrs: tp, layer, or -1 for the tied pieces): a piece's weights
  // all-gathered over dp into an array of their own before the unit that reads them; a layer's
  // full gradient reduce-scattered into its chunk, started after its block_bwd and finished after
  // the next layer's gather (fsdp_rs_start / _finish, as dp_reduce_start / _finish), or blocking
  // (fsdp_reduce_scatter, --no-overlap). Inputs: the gradient, fsdp_rs_finish also the started
  // buffer, and with attrs[2] = 1 the chunk so far (the last input).
  add("fsdp_gather", true, [S](Attrs a) {
    const int tp = tp_of(a), l = static_cast<int>(a[1]);
    return sig({split_f32(S->state_floats(tp))}, {l < 0 ? fsdp_tied_marker() : split_f32(S->fsdp_gathered_layer(tp, l))});
  }, fsdp_gather);
  enum class Rs { kStart, kFinish, kBlocking };
  const auto rs_sig = [S](Rs rs) {
    return [S, rs](Attrs a) {
      const int tp = tp_of(a), l = static_cast<int>(a[1]);
      const ArgSpec g = split_f32(S->fsdp_gathered_layer(tp, l)), c = split_f32(S->fsdp_chunk(tp, 1 + l));
      std::vector<ArgSpec> in{g};
      if (rs == Rs::kFinish) in.push_back(c);
      if (rs != Rs::kStart && a.size() > 2 && a[2] != 0) in.push_back(c);
      return sig(in, {c});
    };
  };
  add("fsdp_rs_start", true, rs_sig(Rs::kStart), fsdp_rs_start);
  add("fsdp_rs_finish", true, rs_sig(Rs::kFinish), fsdp_rs_finish);
  add("fsdp_reduce_scatter", true, rs_sig(Rs::kBlocking), fsdp_reduce_scatter);
  // --fsdp: the tied piece reduce-scattered into the embedding's and final norm's chunks; the
  // update on the shard from its chunks in shard order, then the micro-batch losses.
  add("tied_reduce_scatter", true, [S](Attrs a) {
    const int tp = tp_of(a), L = static_cast<int>(S->cfg().model.n_layers);
    return sig({tied(S, tp)}, {split_f32(S->fsdp_chunk(tp, 0)), split_f32(S->fsdp_chunk(tp, L + 1))});
  }, tied_reduce_scatter);
  add("sharded_update", true, [S](Attrs a) {
    const int tp = tp_of(a), L = static_cast<int>(S->cfg().model.n_layers);
    std::vector<ArgSpec> in = S->state(tp);
    for (int i = 0; i < L + 2; ++i) in.push_back(split_f32(S->fsdp_chunk(tp, i)));
    for (int64_t m = 0; m < S->cfg().workload.microbatches; ++m) in.push_back(split_f64(1));
    return in_place(sig(in, state_out(S, a)));
  }, sharded_update);
}

void add_replica_kernels(const AddFn& add, const Shapes* S) {
  using namespace kernels;
  // Replicas (step_kernels_replicas.cc): attrs[0] = tp; fused_grads [1] = the island, [2] = the shards
  // (1 or dp); island_loss [1] = the micro-batches; replica_add [1] = the piece's (or chunk's)
  // size, [2] = the replicas, [3] = the input whose buffer the sum may take (replica_add_attrs:
  // a received copy; the walk hands it over when nothing else holds it); dp_reduce_scatter and
  // dp_allgather [1] = the piece's size, [2] = the island's dp.
  add("fused_grads", true, [S](Attrs a) {
    const int tp = tp_of(a), shards = static_cast<int>(a[ReplicaAttrs::kFusedShards]);
    std::vector<ArgSpec> out;
    for (int i = 0; i < S->plan(tp).num_pieces(); ++i)
      out.push_back(shards > 1 ? split_f32(static_cast<int64_t>(replica_chunk(S->piece(tp, i), shards))) : piece(S, tp, i));
    out.push_back(split_f64(1));
    return sig(S->state(tp), out);
  }, fused_grads);
  add("shard_grads", true, [S](Attrs a) {
    return sig(S->state(tp_of(a)), {split_f32(S->state_floats(tp_of(a))), split_f64(1)});
  }, shard_grads);
  add("island_loss", true, [](Attrs a) {
    return sig(std::vector<ArgSpec>(static_cast<size_t>(a[1]), split_f64(1)), {split_f64(1)});
  }, island_loss);
  add("replica_add", false, [](Attrs a) {
    PWM_CHECK(a[2] >= 2 && (a.size() <= ReplicaAttrs::kAddInto || a[ReplicaAttrs::kAddInto] == 0 ||
                            a[ReplicaAttrs::kAddInto] == 1),
              "replica_add: {} replicas, sum into input {} (want >= 2 replicas, into input 0 or 1)", a[2],
              a.size() > ReplicaAttrs::kAddInto ? a[ReplicaAttrs::kAddInto] : -1);
    Signature s = sig(std::vector<ArgSpec>(static_cast<size_t>(a[2]), split_f32(a[1])), {split_f32(a[1])});
    if (a.size() > ReplicaAttrs::kAddInto) s.reuse = {static_cast<int32_t>(a[ReplicaAttrs::kAddInto])};
    return s;
  }, replica_add);
  add("dp_reduce_scatter", true, [](Attrs a) {
    return sig({split_f32(a[1])}, {split_f32(static_cast<int64_t>(replica_chunk(a[1], static_cast<int>(a[2]))))});
  }, dp_reduce_scatter);
  add("dp_allgather", true, [](Attrs a) {
    return sig({split_f32(static_cast<int64_t>(replica_chunk(a[1], static_cast<int>(a[2]))))}, {split_f32(a[1])});
  }, dp_allgather);
  // replica_update: attrs[1] = 1 (--fsdp, chained): the gradient shard as its chunks.
  add("replica_update", true, [S](Attrs a) {
    return in_place(update_sig(S, a, replica_update_args(*S, tp_of(a), a.size() > 1 && a[1] != 0)));
  }, replica_update);
}

void add_pipeline_kernels(const AddFn& add, const Shapes* S) {
  using namespace kernels;
  // The pipeline's (attrs[0] = tp; [1] = the stage, or a size or count). pipe_sqnorm sums its
  // share over the stage's tp group (gang-scheduled).
  add("pipe_sqnorm", true, [S](Attrs a) {
    return sig(stage_pieces(S, tp_of(a), static_cast<int>(a[1])), {split_f64(1)});
  }, pipe_sqnorm);
  add("pipe_update", false, [S](Attrs a) {
    const int tp = tp_of(a), stage = static_cast<int>(a[1]);
    const UpdateArgs args = pipe_update_args(*S, stage);
    const ArgSpec total = split_f64(1);
    std::vector<ArgSpec> losses(args.losses, split_f64(1));
    return in_place(sig(args.pack<ArgSpec>(State<ArgSpec>::from(S->state(tp)), &total, stage_pieces(S, tp, stage), losses),
                        state_out(S, a)));
  }, pipe_update);
  add("merge", false, [S](Attrs a) {
    return sig(std::vector<ArgSpec>(static_cast<size_t>(S->pipe().stages), split_f32(S->total(tp_of(a)))),
               {split_f32(S->total(tp_of(a)))});
  }, merge);
  add("zeros", false, [](Attrs a) { return sig({}, {split_f32(a[1])}); }, zeros);
  add("add", false, [](Attrs a) { return sig({split_f32(a[1]), split_f32(a[1])}, {split_f32(a[1])}); }, add_arrays);
  add("sum", false, [](Attrs a) {
    return sig(std::vector<ArgSpec>(static_cast<size_t>(a[1]), split_f64(1)), {split_f64(1)});
  }, sum_scalars);
}

// --expert-island (island_kernels.cc; attrs: tp, layer[, j: the experts' device]). The dense
// slice's nodes take and give one split block per experts' device; an experts' device's node
// takes the blocks of every dense device whole. Only the update is gang-scheduled: no kernel
// here communicates.
void add_island_kernels(const AddFn& add, const Shapes* S) {
  using namespace kernels;
  if (!S->expert_island()) return;
  const size_t P = static_cast<size_t>(S->cfg().mesh.ep);
  const ArgSpec params = split_f32(S->total(1)), act = split_f32(S->act());
  add("moe_send", false, [=](Attrs) {
    std::vector<ArgSpec> out{act, split_f32(S->saved(1))};
    out.insert(out.end(), P, S->island_block());
    out.insert(out.end(), P, S->island_counts());
    return sig({params, act}, out);
  }, moe_send);
  add("expert_fwd", false, [=](Attrs) {
    return sig({params, S->island_blocks(), S->island_blocks_counts()}, {S->island_blocks()});
  }, expert_fwd);
  add("moe_combine", false, [=](Attrs) {
    std::vector<ArgSpec> in{act, split_f32(S->saved(1))};
    in.insert(in.end(), P, S->island_block());
    return sig(in, {act});
  }, moe_combine);
  add("moe_bwd_send", false, [=](Attrs) {
    return sig({split_f32(S->saved(1)), act}, std::vector<ArgSpec>(P, S->island_block()));
  }, moe_bwd_send);
  for (bool acc : {false, true}) {
    add(acc ? "expert_bwd_acc" : "expert_bwd", false, [=](Attrs a) {
      const ArgSpec g = piece(S, 1, model::StepPlan::layer_piece(static_cast<int>(a[1])));
      std::vector<ArgSpec> in{params, S->island_blocks(), S->island_blocks()};
      if (acc) in.push_back(g);
      return sig(in, {S->island_blocks(), g});
    }, expert_bwd);
    add(acc ? "block_bwd_remote_acc" : "block_bwd_remote", false, [=](Attrs a) {
      Signature s = block_bwd_sig(S, acc)(a);
      s.inputs.insert(s.inputs.end(), P, S->island_block());
      return s;
    }, block_bwd_remote);
  }
  // The MoE layers' pieces, in layer order.
  const auto moe_pieces = [S] {
    std::vector<ArgSpec> v;
    for (int l = 0; l < static_cast<int>(S->cfg().model.n_layers); ++l)
      if (S->moe_layer(l)) v.push_back(piece(S, 1, model::StepPlan::layer_piece(l)));
    return v;
  };
  // Per experts' device: its expert parameters (expert_sqnorm's one squared norm each) and their
  // floats (expert_pack's ranges, back to back).
  int64_t expert_params = 0, expert_floats = 0;
  for (const model::ParamInfo& q : S->layout(1).params())
    if (q.expert) {
      expert_params += 1;
      expert_floats += q.size;
    }
  add("expert_sqnorm", false, [=](Attrs) { return sig(moe_pieces(), {rep_f64(expert_params)}); }, expert_sqnorm);
  add("expert_update", false, [=](Attrs) {
    std::vector<ArgSpec> in = S->state(1);
    in.push_back(rep_f64(2 * S->cfg().mesh.dp));
    for (const ArgSpec& g : moe_pieces()) in.push_back(g);
    return in_place(sig(in, S->state(1)));
  }, expert_update);
  add("expert_pack", false, [=](Attrs) { return sig({rep_f32(S->total(1))}, {rep_f32(expert_floats)}); }, expert_pack);
  add("expert_merge", false, [=](Attrs) {
    std::vector<ArgSpec> in{params};
    in.insert(in.end(), P, rep_f32(expert_floats));
    return sig(in, {params});
  }, expert_merge);
}

}  // namespace

void register_train_kernels(const KernelNames& names, std::shared_ptr<DeviceSet> devices) {
  const Shapes* S = &devices->shapes();  // lives as long as `devices`, which every kernel captures
  const AddFn add = [&](const std::string& k, bool collectives, std::function<Signature(Attrs)> sigfn, Body body) {
    const bool step_work = counts_as_step_work(k);
    KernelFn fn = [devices, k, body, step_work](KernelContext& ctx) {
      TrainingDevice& dev = devices->at(ctx.world_rank());
      Scope scope(dev, k, step_work);
      // Started dp reductions advance between kernels (device.h, start_reduce).
      dev.poll_reduces();
      try {
        body(dev, ctx, scope);
      } catch (const collectives::Interrupted&) {
        dev.abandon_step();
        throw;
      }
      dev.poll_reduces();
    };
    KernelRegistry::global().add(
        KernelDef{names(k), collectives, [devices, sigfn](Attrs a, int) { return sigfn(a); }, std::move(fn)});
  };
  add_state_kernels(add, S);
  // Not timed: the trace fragment is read after the last span it should contain.
  KernelRegistry::global().add(KernelDef{names("trace"), false, [](Attrs a, int) {
    return sig({}, {ArgSpec{TensorSpec{DataType::kInt64, {a[1]}}, Sharding::kSplit}});
  }, [devices](KernelContext& ctx) { kernels::trace_dump(devices->at(ctx.world_rank()), ctx); }});
  // Recovery with no spare left (attrs: tp, replicas): this worker's devices take the shapes of
  // a run with that many replicas (DeviceSet::set_replicas); out: the count, to wait on.
  KernelRegistry::global().add(KernelDef{names("set_replicas"), false, [](Attrs, int) {
    return sig({}, {ArgSpec{TensorSpec{DataType::kInt64, {1}}, Sharding::kSplit}});
  },
                                         [devices](KernelContext& ctx) {
                                           devices->set_replicas(static_cast<int>(ctx.attr(1)));
                                           ctx.out<int64_t>(0)[0] = ctx.attr(1);
                                         }});
  add_unit_kernels(add, S);
  add_replica_kernels(add, S);
  add_pipeline_kernels(add, S);
  add_island_kernels(add, S);
}

}  // namespace pwm::programs
