// --fsdp's step kernels, spmd_train's own FSDP step (train/fsdp.h) on a slice: the fused step's
// gradients and update on the dp shards (fsdp_gradients, shard_update: also the replicas'
// shard_grads and replica_update), and for chained and opbyop the gathers and reduce-scatters as
// kernels of their own (fsdp_gather, fsdp_rs_start / _finish, fsdp_reduce_scatter,
// tied_reduce_scatter) around the unit kernels (step_kernels_units.cc), then the update on the
// shard (sharded_update).
#include <cmath>
#include <cstring>

#include "common/time.h"
#include "model/optim.h"
#include "train/step.h"
#include "programs/kernels_impl.h"

namespace pwm::programs::kernels {

// --fsdp: the step on the dp shards, spmd_train's own (train/fsdp.h). The gradients: every layer
// gathered before its forward and its backward, its gradient reduce-scattered over the island's
// dp group into `grads` (shard_total() floats: the device's gradient shard, dev.fsdp_grads(), or a
// kernel's output); reads data-parallel index `data_index`; returns the device's mean loss.
double fsdp_gradients(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int64_t step, int data_index,
                      float* grads, double* comm_s) {
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  pwm::train::StepHooks hooks;
  trace_units(dev, hooks);
  hooks.tp_reduce = dev.tp_reducer(dev.tp_comm(ctx, p), comm_s);
  const double local = f.accumulate(dev.data(), step, data_index, ctx.in<float>(kParams).data(), grads,
                                    dev.step_memory(dev.layout(p)), dev.tokens(), hooks);
  *comm_s += f.comm_seconds();
  return local;
}

// The update on the shards: the squared norm of the summed gradient shard `grads` summed over tp
// and dp, the loss (`loss_sum`: over every data-parallel device, or null: this device's
// `local_loss`, summed here over dp), AdamW on the shard written to the new state (the inputs
// copied, then updated in place: the same arithmetic per element as spmd_train's).
pwm::train::UpdateResult shard_update(TrainingDevice& dev, KernelContext& ctx, const Pos& p, int64_t step,
                                     const float* grads, double local_loss, const double* loss_sum, double* comm_s,
                                     double* loss_out) {
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  // Testing hook: as finish_step's, after the gradients and before the update.
  if (dev.cfg().hooks.kill_now(step, ctx.world_rank())) dev.cfg().hooks.kill_self();
  double red[2] = {loss_sum ? *loss_sum : local_loss, f.grad_sq_norm(grads)};
  const double t0 = now_s();
  if (Communicator* c = dev.tp_comm(ctx, p))
    c->allreduce(&red[1], &red[1], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  Communicator* dp = dev.dp_comm(ctx, p);  // (--fsdp needs dp >= 2)
  dp->allreduce(&red[1], &red[1], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  if (!loss_sum)
    dp->allreduce(&red[0], &red[0], 1, collectives::DataType::kFloat64, ReduceOp::kSum, Algorithm::kRecursiveDoubling);
  *comm_s += now_s() - t0;
  *loss_out = red[0] / dev.cfg().data_parallel();
  for (size_t i : {kParams, kAdamM, kAdamV}) {
    auto out = ctx.out<float>(i);
    pass_through(out.data(), ctx.in<float>(i).data(), out.size());
  }
  const bool skip = pwm::train::nonfinite_step(dev.cfg().hooks, step, loss_out, &red[1]);
  const pwm::train::UpdateResult u{model::lr_at(dev.cfg().optim, step), std::sqrt(red[1])};
  if (!skip)
    f.adamw(step, u.lr, model::clip_factor(dev.cfg().optim, red[1]), ctx.out<float>(kParams).data(), grads,
            ctx.out<float>(kAdamM).data(), ctx.out<float>(kAdamV).data());
  return u;
}

// --fsdp (chained; attrs: tp): the tied piece (embed then final_norm, summed over the
// micro-batches) reduce-scattered into the embedding's and the final norm's chunks.
void tied_reduce_scatter(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  const ParamLayout& layout = dev.layout(p);
  const int64_t embed_n = layout.get("embed").size;
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  const float* tied = ctx.in<float>(0).data();
  f.reduce_tied_grads(tied, tied + embed_n, ctx.out<float>(0).data(), ctx.out<float>(1).data());
  f.release_tied_params();  // the step's last reader was its last head
  dev.add_comm(f.comm_seconds());
}

// --fsdp (chained, opbyop; attrs: tp, layer or -1): input the parameters' shard; output layer
// l's weights gathered over dp, or for -1 a marker (1): the embedding and final norm are gathered
// into the device's Fsdp, held until tied_reduce_scatter (as spmd_train holds them for the step:
// the model reads them where the full layout has them, which one array of their own is not).
void fsdp_gather(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  pwm::train::Fsdp& f = dev.fsdp(ctx, p);
  const int l = static_cast<int>(ctx.attr(1));
  const float* shard = ctx.in<float>(0).data();
  if (l < 0) {
    f.gather_tied_params(shard);
    ctx.out<int64_t>(0)[0] = 1;
  } else {
    f.gather_layer(l, shard, ctx.out<float>(0).data());
  }
  dev.add_comm(f.comm_seconds());
}

namespace {
// The chunk so far (attrs[2] = 1: the last input) plus this micro-batch's, as Fsdp::accumulate
// adds into the shard; the first micro-batch's is copied.
void add_chunk(KernelContext& ctx, std::span<const float> sum) {
  auto out = ctx.out<float>(0);
  PWM_CHECK_EQ(out.size(), sum.size());
  if (ctx.attrs().size() > 2 && ctx.attr(2) != 0) {
    auto prev = ctx.in<float>(ctx.num_inputs() - 1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = prev[i] + sum[i];
  } else if (out.data() != sum.data()) {
    std::memcpy(out.data(), sum.data(), sizeof(float) * out.size());
  }
}
}  // namespace

// --fsdp (attrs: tp, layer): input the layer's full gradient; output the buffer its chunk lands
// in, complete when fsdp_rs_finish has run (its only reader). The same reduce-scatter as
// spmd_train's (Fsdp::start_reduce_layer): the same bits.
void fsdp_rs_start(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  dev.start_layer_reduce_scatter(ctx, pos(ctx), static_cast<int>(ctx.attr(1)), ctx.in<float>(0).data(),
                                 ctx.out<float>(0).data());
}

// inputs: the gradient (kept alive while the reduce-scatter reads it), the started buffer[, the
// chunk so far]; output: the chunk.
void fsdp_rs_finish(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  auto started = ctx.in<float>(1);
  dev.finish_reduce(started.data());
  add_chunk(ctx, started);
}

// The blocking form (--no-overlap): inputs the gradient[, the chunk so far]; output the chunk.
void fsdp_reduce_scatter(TrainingDevice& dev, KernelContext& ctx, Scope&) {
  const Pos p = pos(ctx);
  auto out = ctx.out<float>(0);
  const bool prev = ctx.attrs().size() > 2 && ctx.attr(2) != 0;
  std::vector<float> tmp(prev ? out.size() : 0);  // (the first micro-batch's lands in the output)
  float* sum = prev ? tmp.data() : out.data();
  const int64_t t0 = now_us();
  collectives::Work w = dev.fsdp(ctx, p).start_reduce_layer(static_cast<int>(ctx.attr(1)), ctx.in<float>(0).data(), sum);
  w.wait();
  dev.add_comm((now_us() - t0) * 1e-6);
  add_chunk(ctx, {sum, out.size()});
}

// --fsdp (chained; attrs: tp): inputs the state (shards), the gradient's chunks in shard order
// (embedding, layers, final norm), the micro-batch losses; the update on the shard.
void sharded_update(TrainingDevice& dev, KernelContext& ctx, Scope& scope) {
  const Pos p = pos(ctx);
  const int64_t step = ctx.in<int64_t>(kStep)[0];
  constexpr size_t kArgs = kStep + 1;  // the state's arrays
  const size_t chunks = static_cast<size_t>(dev.cfg().model.n_layers) + 2, M = ctx.num_inputs() - kArgs - chunks;
  float* g = dev.fsdp_grads(ctx, p);
  for (size_t i = 0; i < chunks; ++i) {
    auto c = ctx.in<float>(kArgs + i);
    g = std::copy(c.begin(), c.end(), g);
  }
  PWM_CHECK_EQ(g - dev.fsdp_grads(ctx, p), dev.fsdp(ctx, p).shard_total());
  double local = 0;
  for (size_t m = 0; m < M; ++m) local += ctx.in<double>(kArgs + chunks + m)[0];
  local /= static_cast<double>(M);
  double comm_s = 0, loss = 0;
  const pwm::train::UpdateResult u =
      shard_update(dev, ctx, p, step, dev.fsdp_grads(ctx, p), local, nullptr, &comm_s, &loss);
  ctx.out<int64_t>(kStep)[0] = step + 1;
  dev.report(scope, u, loss, comm_s, ctx.out<double>(StepOutputs<int>::kStats));
}

}  // namespace pwm::programs::kernels
