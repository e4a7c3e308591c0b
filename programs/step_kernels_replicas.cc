// Replicas' step kernels: one slice per island, the cross-island exchange as program nodes.
//
// Each island runs its own step on its slice; a gradient piece reduced inside the island goes to
// the peer device (same shard index) of every other island as a runtime transfer, and
// replica_add on each island sums the islands' pieces in island order, so every island holds
// the same bits and applies the same update (docs/pathways_train.md, "Replicas"). The update
// is finish_step's (step_kernels.cc), with --fsdp shard_update's (step_kernels_fsdp.cc).
#include <cstring>
#include <vector>

#include "common/time.h"
#include "train/step.h"
#include "programs/kernels_impl.h"

namespace pwm::programs::kernels {

// The whole island step (attrs: tp, replica, shards): the plan into the device's gradient buffer
// with the bucketed dp AllReduce inside the island, as fused_step; outputs the plan's pieces
// (copies out of the buffer, for the exchange) and the island's loss (the dp sum of the local
// means). shards = dp > 1: each piece's chunk of this device's dp rank only (replica_chunk), the
// 1/dp share it exchanges with its peers; the buffer already holds the whole sum, so the chunk
// has the bits the whole piece has.
void fused_grads(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const model::StepPlan& plan = dev.shapes().plan(p.tp);
  const int replica = static_cast<int>(ctx.attr(ReplicaAttrs::kFusedReplica));
  double comm_s = 0;
  // The flat view: dp = replicas x dp, this device's data index replica x dp + dp rank.
  double loss = fused_gradients(dev, ctx, p, dev.flat_cfg(), replica * p.dp + p.dp_rank, &comm_s);
  if (Communicator* c = dev.dp_comm(ctx, p)) {
    const double t0 = now_s();
    c->allreduce(&loss, &loss, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
    comm_s += now_s() - t0;
  }
  dev.add_comm(comm_s);
  const int shards = static_cast<int>(ctx.attr(ReplicaAttrs::kFusedShards));
  std::vector<float> whole;
  for (int i = 0; i < plan.num_pieces(); ++i) {
    auto o = ctx.out<float>(static_cast<size_t>(i));
    float* out = o.data();
    if (shards > 1) {
      whole.resize(static_cast<size_t>(dev.shapes().piece(p.tp, i)));
      out = whole.data();
    }
    for (const auto& [b, e] : plan.piece_ranges(i)) {
      std::memcpy(out, dev.grads() + b, sizeof(float) * static_cast<size_t>(e - b));
      out += e - b;
    }
    if (shards > 1) copy_chunk(whole, p.dp_rank, o);
  }
  ctx.out<double>(static_cast<size_t>(plan.num_pieces()))[0] = loss;
  dev.backward_done(scope);
}

// This island's sum of one piece over its dp group, of which this device keeps chunk k = its dp
// rank (attrs: tp, size, dp): a ReduceScatter of the piece zero-padded to dp x replica_chunk
// elements. Replaces dp_allreduce when the islands exchange 1/dp of each piece (dp_allgather
// makes it whole after the exchange): at dp = 2 each element is a + b, the bits of the
// AllReduce and of spmd_train's hierarchical ReduceScatter. A padded copy only when dp does not
// divide the piece.
void dp_reduce_scatter(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto in = ctx.in<float>(0);
  auto out = ctx.out<float>(0);
  Communicator* c = dev.dp_comm(ctx, pos(ctx));
  PWM_CHECK(c != nullptr && out.size() == replica_chunk(static_cast<int64_t>(in.size()), c->size()),
            "dp_reduce_scatter: {} elements into chunks of {}", in.size(), out.size());
  const size_t whole = out.size() * static_cast<size_t>(c->size());
  std::vector<float> padded;
  if (whole != in.size()) {
    padded.assign(whole, 0.0f);
    std::memcpy(padded.data(), in.data(), sizeof(float) * in.size());
  }
  const double t0 = now_s();
  c->reduce_scatter(padded.empty() ? in.data() : padded.data(), out.data(), out.size(), collectives::DataType::kFloat32,
                    ReduceOp::kSum);
  dev.add_comm(now_s() - t0);
}

// The whole piece again from the dp group's chunks (attrs: tp, size, dp): an AllGather, the padding
// dropped (gathered into the output itself when dp divides the piece). No arithmetic: every
// device ends with the same bits.
void dp_allgather(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto in = ctx.in<float>(0);
  auto out = ctx.out<float>(0);
  Communicator* c = dev.dp_comm(ctx, pos(ctx));
  PWM_CHECK(c != nullptr && in.size() == replica_chunk(static_cast<int64_t>(out.size()), c->size()),
            "dp_allgather: chunks of {} into {} elements", in.size(), out.size());
  const size_t whole = in.size() * static_cast<size_t>(c->size());
  std::vector<float> all(whole == out.size() ? 0 : whole);
  const double t0 = now_s();
  c->allgather(in.data(), all.empty() ? out.data() : all.data(), in.size(), collectives::DataType::kFloat32);
  dev.add_comm(now_s() - t0);
  if (!all.empty()) std::memcpy(out.data(), all.data(), sizeof(float) * out.size());
}

// --fsdp: the whole island step on the shards (attrs: tp, replica): the device's gradient shard
// summed over the island's dp group (Fsdp's reduce-scatters; the flat view's data index and
// scale, as fused_grads), which is what it exchanges with its peers, and the island's loss. The
// reduce-scatters write into the output itself: the device keeps no second gradient shard.
void shard_grads(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const int replica = static_cast<int>(ctx.attr(ReplicaAttrs::kFusedReplica));
  auto out = ctx.out<float>(0);
  PWM_CHECK_EQ(static_cast<int64_t>(out.size()), dev.fsdp(ctx, p).shard_total());
  double comm_s = 0;
  double loss =
      fsdp_gradients(dev, ctx, p, ctx.in<int64_t>(kStep)[0], replica * p.dp + p.dp_rank, out.data(), &comm_s);
  const double t0 = now_s();
  dev.dp_comm(ctx, p)->allreduce(&loss, &loss, 1, collectives::DataType::kFloat64, ReduceOp::kSum,
                                 Algorithm::kRecursiveDoubling);
  dev.add_comm(comm_s + now_s() - t0);
  ctx.out<double>(1)[0] = loss;
  dev.backward_done(scope);
}

// The island's loss (chained; attrs: tp, micro-batches): the dp sum of the local means.
void island_loss(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  double local = 0;
  for (size_t m = 0; m < ctx.num_inputs(); ++m) local += ctx.in<double>(m)[0];
  local /= static_cast<double>(ctx.num_inputs());
  if (Communicator* c = dev.dp_comm(ctx, pos(ctx))) {
    const double t0 = now_s();
    c->allreduce(&local, &local, 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
    dev.add_comm(now_s() - t0);
  }
  ctx.out<double>(0)[0] = local;
}

// The islands' copies of one piece, summed in island order (attrs: tp, size, replicas): every
// island adds the same inputs in the same order, so all hold the same bits. With two islands
// the sum is a + b, SPMD's two-rank AllReduce, bit for bit. The output may be input 0's or 1's
// buffer (replica_add_attrs): the first pass reads both before it writes, the others read
// inputs 2.. only.
void replica_add(TrainingDevice&, KernelContext& ctx, Scope&) {
  auto o = ctx.out<float>(0);
  auto a = ctx.in<float>(0), b = ctx.in<float>(1);
  for (size_t i = 0; i < o.size(); ++i) o[i] = a[i] + b[i];
  for (size_t r = 2; r < ctx.num_inputs(); ++r) {
    auto c = ctx.in<float>(r);
    for (size_t i = 0; i < o.size(); ++i) o[i] += c[i];
  }
}

// inputs: replica_update_args(): the state, the summed pieces (--fsdp: the summed gradient
// shard, or with attrs[1] = 1 its chunks), each island's loss.
void replica_update(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  StepStats xchg;  // the exchange's timing (StepStats' three exchange words)
  xchg.xchg_exposed_ms = dev.exchange_exposed_s() * 1e3;
  xchg.bwd_end_us = dev.backward_end_ctrl_us();
  xchg.update_start_us = dev.now_ctrl_us();
  const Pos p = pos(ctx);
  if (dev.cfg().mesh.fsdp) {
    const UpdateArgs args = replica_update_args(dev.shapes(), p.tp, ctx.attrs().size() > 1 && ctx.attr(1) != 0);
    PWM_CHECK_EQ(ctx.num_inputs(), args.count());
    const int64_t step = ctx.in<int64_t>(kStep)[0];
    double total = 0;  // island order, as the gradients
    for (size_t r = 0; r < args.losses; ++r) total += ctx.in<double>(args.loss(r))[0];
    const float* g = ctx.in<float>(args.piece(0)).data();
    if (args.pieces > 1) {  // the chunks, in shard order, into the device's gradient shard
      float* to = dev.fsdp_grads(ctx, p);
      for (size_t i = 0; i < args.pieces; ++i) {
        auto c = ctx.in<float>(args.piece(i));
        to = std::copy(c.begin(), c.end(), to);
      }
      PWM_CHECK_EQ(to - dev.fsdp_grads(ctx, p), dev.fsdp(ctx, p).shard_total());
      g = dev.fsdp_grads(ctx, p);
    }
    double comm_s = 0, loss = 0;
    const pwm::train::UpdateResult u = shard_update(dev, ctx, p, step, g, 0.0, &total, &comm_s, &loss);
    ctx.out<int64_t>(kStep)[0] = step + 1;
    dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats), &xchg);
    return;
  }
  const ParamLayout& layout = dev.layout(p);
  const model::StepPlan& plan = dev.shapes().plan(p.tp);
  const UpdateArgs args = replica_update_args(dev.shapes(), p.tp);
  PWM_CHECK_EQ(ctx.num_inputs(), args.count());
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  model::GradView grads;
  for (int i = 0; i < plan.num_pieces(); ++i) grads.add(plan.piece_ranges(i), ctx.in<float>(args.piece(i)).data());
  double total = 0;  // island order, as the gradients
  for (size_t r = 0; r < args.losses; ++r) total += ctx.in<double>(args.loss(r))[0];
  double comm_s = 0, loss = 0;
  const pwm::train::UpdateResult u = finish_step(dev, ctx, p, layout, step, 0.0, grads, &comm_s, &loss, &total);
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats), &xchg);
}

}  // namespace pwm::programs::kernels
