#include "train/fsdp.h"

#include <algorithm>
#include <cstdint>

#include "common/check.h"
#include "common/time.h"
#include "model/optim.h"

namespace pwm::train {

using collectives::DataType;
using collectives::ReduceOp;
using collectives::Work;

Fsdp::Fsdp(const train::TrainConfig& cfg, const model::ParamLayout& layout, const model::StepPlan& plan,
           collectives::Communicator* dp, collectives::Communicator* replicas)
    : cfg_(cfg), layout_(layout), plan_(plan), dp_(dp), replicas_(replicas), D_(dp->size()), r_(dp->rank()),
      L_(plan.layers()) {
  PWM_CHECK(D_ >= 2, "fsdp needs a dp group of 2 or more ranks");
  auto add = [&](int64_t lo, int64_t hi) {
    Piece p{lo, hi, (hi - lo + D_ - 1) / D_, shard_total_, 0, 0};
    p.own_lo = std::min(hi, lo + r_ * p.s);
    p.own_hi = std::min(hi, lo + (r_ + 1) * p.s);
    shard_total_ += p.s;
    pieces_.push_back(p);
  };
  const model::ParamInfo& e = layout.get("embed");
  add(e.offset, e.offset + e.size);
  for (int l = 0; l < L_; ++l) {
    add(layout.layer(l).begin, layout.layer(l).end);
    max_layer_s_ = std::max(max_layer_s_, pieces_.back().s);
  }
  add(layout.final_norm_offset(), layout.total());
  // A gather writes D * s >= n floats from a piece's start: up to D - 1 past the buffer's end.
  const size_t floats = static_cast<size_t>(layout.total() + D_);
  tied_params_ = LazyArray<float>(floats);
  tied_grads_ = LazyArray<float>(floats);
  // The slots and the reduce-scatter scratch are made on first use: the program nodes' API
  // (pathways_train chained) keeps its gathered layers and gradients in the runtime's arrays.
}

void Fsdp::ensure_rs_tmp() {
  if (!rs_tmp_.empty()) return;
  rs_tmp_.assign(static_cast<size_t>(std::max(max_layer_s_, std::max(pieces_.front().s, pieces_.back().s))), 0.0f);
  hold(static_cast<int64_t>(rs_tmp_.size() * sizeof(float)));
}

Fsdp::~Fsdp() = default;

std::vector<int64_t> Fsdp::chunk_sizes(const model::ParamLayout& layout, int D) {
  const auto s = [D](int64_t n) { return (n + D - 1) / D; };
  std::vector<int64_t> c{s(layout.get("embed").size)};
  for (int l = 0; l < layout.config().n_layers; ++l) c.push_back(s(layout.layer(l).end - layout.layer(l).begin));
  c.push_back(s(layout.total() - layout.final_norm_offset()));
  return c;
}

int64_t Fsdp::shard_total(const model::ParamLayout& layout, int D) {
  int64_t t = 0;
  for (int64_t n : chunk_sizes(layout, D)) t += n;
  return t;
}

void Fsdp::gather_layer(int l, const float* params_shard, float* out) {
  comm_s_ = 0;
  const Piece& p = layer_piece(l);
  Work w = dp_->iallgather(params_shard + p.off, out, static_cast<size_t>(p.s), DataType::kFloat32);
  wait(w);
}

const float* Fsdp::layer_base(int l, const float* gathered) const { return gathered - layer_piece(l).lo; }
float* Fsdp::layer_base(int l, float* gathered) const { return gathered - layer_piece(l).lo; }

void Fsdp::gather_tied_params(const float* params_shard) {
  PWM_CHECK(!tied_held_, "fsdp: the embedding and final norm are gathered twice");
  comm_s_ = 0;
  gather_tied(params_shard);
  tied_held_ = true;
}

const float* Fsdp::tied_params() const {
  PWM_CHECK(tied_held_, "fsdp: the embedding and final norm are read before their gather");
  return tied_params_.data();
}

void Fsdp::release_tied_params() {
  PWM_CHECK(tied_held_, "fsdp: the embedding and final norm are released but not held");
  release_tied();
  tied_held_ = false;
}

Work Fsdp::start_reduce_layer(int l, const float* grads, float* chunk) {
  return dp_->ireduce_scatter(grads, chunk, static_cast<size_t>(layer_piece(l).s), DataType::kFloat32, ReduceOp::kSum);
}

void Fsdp::reduce_tied_grads(const float* embed, const float* final_norm, float* embed_chunk, float* final_chunk) {
  comm_s_ = 0;
  // As finish_tied_grads: each piece zero-padded to D chunks, reduce-scattered.
  const Piece* pieces[2] = {&pieces_.front(), &pieces_.back()};
  const float* from[2] = {embed, final_norm};
  float* to[2] = {embed_chunk, final_chunk};
  std::vector<float> padded;
  for (int i = 0; i < 2; ++i) {
    const Piece& p = *pieces[i];
    padded.assign(static_cast<size_t>(p.s * D_), 0.0f);
    std::copy(from[i], from[i] + (p.hi - p.lo), padded.begin());
    Work w = dp_->ireduce_scatter(padded.data(), to[i], static_cast<size_t>(p.s), DataType::kFloat32, ReduceOp::kSum);
    wait(w);
  }
}

void Fsdp::hold(int64_t bytes) {
  held_ += bytes;
  peak_held_ = std::max(peak_held_, held_);
}

float* Fsdp::take_slot(int l, bool grads) {
  int& holder = slot_layer_[grads];
  PWM_CHECK(holder < 0, "fsdp: layer {} needs the {} slot that layer {} still holds", l, grads ? "gradient" : "weight",
            holder);
  holder = l;
  if (slot_[grads].empty()) slot_[grads].assign(static_cast<size_t>(max_layer_s_ * D_), 0.0f);
  return slot_[grads].data();
}

void Fsdp::put_slot(int l, bool grads) {
  int& holder = slot_layer_[grads];
  PWM_CHECK(holder == l, "fsdp: layer {} returns a {} slot held by layer {}", l, grads ? "gradient" : "weight", holder);
  holder = -1;
}

float* Fsdp::slot_base(int l, bool grads) {
  PWM_CHECK(slot_layer_[grads] == l, "fsdp: layer {} is not in the {} slot", l, grads ? "gradient" : "weight");
  // Points before the slot by the layer's offset; the model only dereferences it at offsets
  // inside the layer, i.e. inside the slot.
  return slot_[grads].data() - layer_piece(l).lo;
}

void Fsdp::wait(Work& w) {
  if (!w.valid()) return;
  const double t0 = now_s();
  w.wait();
  w = Work();
  comm_s_ += now_s() - t0;
}

void Fsdp::take_shard(const float* full, float* shard) const {
  std::fill(shard, shard + shard_total_, 0.0f);
  for (const Piece& p : pieces_)
    if (p.own_hi > p.own_lo) std::copy(full + p.own_lo, full + p.own_hi, shard + p.off);
}

void Fsdp::gather_full(const float* shard, float* full) {
  std::vector<float> tmp;
  for (const Piece& p : pieces_) {
    tmp.resize(static_cast<size_t>(p.s * D_));
    dp_->allgather(shard + p.off, tmp.data(), static_cast<size_t>(p.s), DataType::kFloat32);
    std::copy(tmp.begin(), tmp.begin() + (p.hi - p.lo), full + p.lo);
  }
}

void Fsdp::for_owned(const std::function<void(const model::ParamInfo&, int64_t, int64_t, int64_t)>& fn) const {
  // Pieces in buffer order and tensors in layout order: a fixed order for the norm's sum.
  for (const Piece& p : pieces_)
    for (const model::ParamInfo& t : layout_.params()) {
      const int64_t lo = std::max(p.own_lo, t.offset), hi = std::min(p.own_hi, t.offset + t.size);
      if (lo < hi) fn(t, lo, hi, p.off + (lo - p.own_lo));
    }
}

double Fsdp::grad_sq_norm(const float* grads_shard) const {
  double total = 0;
  for_owned([&](const model::ParamInfo& t, int64_t lo, int64_t hi, int64_t off) {
    if (t.replicated() && layout_.tp_rank() != 0) return;
    total += model::sq_norm(grads_shard + off, static_cast<size_t>(hi - lo));
  });
  return total;
}

void Fsdp::adamw(int64_t step, double lr, double clip, float* params, const float* grads, float* m, float* v) const {
  for_owned([&](const model::ParamInfo& t, int64_t lo, int64_t hi, int64_t off) {
    model::adamw_span(cfg_.optim, step, lr, clip, t.weight_decay, params + off, grads + off, m + off, v + off,
                      static_cast<size_t>(hi - lo));
  });
}

void Fsdp::gather_tied(const float* params_shard) {
  Work w[2];
  for (int i = 0; i < 2; ++i) {
    const Piece& p = i == 0 ? pieces_.front() : pieces_.back();
    w[i] = dp_->iallgather(params_shard + p.off, tied_params_.data() + p.lo, static_cast<size_t>(p.s),
                           DataType::kFloat32);
    hold(p.s * D_ * static_cast<int64_t>(sizeof(float)));
  }
  wait(w[0]);
  wait(w[1]);
}

void Fsdp::release_tied() {
  for (const Piece* p : {&pieces_.front(), &pieces_.back()}) {
    tied_params_.release(p->lo, p->lo + p->s * D_);
    hold(-p->s * D_ * static_cast<int64_t>(sizeof(float)));
  }
}

double Fsdp::accumulate(const train::TextDataset& data, int64_t step, int data_index, const float* params_shard,
                        float* grads_shard, model::Workspace<float>& ws, int32_t* tokens,
                        const train::StepHooks& hooks) {
  using model::UnitKind;
  comm_s_ = 0;
  const int64_t G = cfg_.workload.global_batch, M = cfg_.workload.microbatches;
  const float grad_scale = 1.0f / static_cast<float>(M * cfg_.data_parallel());
  auto span = [&](const char* name, int64_t t0, int64_t t1) {
    if (hooks.span) hooks.span(name, t0, t1);
  };
  const int64_t fbytes = sizeof(float);
  ensure_rs_tmp();
  std::fill(grads_shard, grads_shard + shard_total_, 0.0f);
  gather_tied(params_shard);
  float* gt = begin_tied_grads();

  std::vector<Work> gathers(static_cast<size_t>(L_));
  std::vector<char> gathered(static_cast<size_t>(L_), 0);
  auto start_gather = [&](int l) {
    if (l < 0 || l >= L_ || gathered[l] || gathers[l].valid()) return;
    const Piece& p = layer_piece(l);
    gathers[l] = dp_->iallgather(params_shard + p.off, take_slot(l, false), static_cast<size_t>(p.s), DataType::kFloat32);
    hold(p.s * D_ * fbytes);
  };
  auto need = [&](int l) {
    start_gather(l);
    wait(gathers[l]);
    gathered.at(static_cast<size_t>(l)) = 1;
  };
  auto drop = [&](int l) {
    put_slot(l, false);
    hold(-layer_piece(l).s * D_ * fbytes);
    gathered[l] = 0;
  };
  // A layer's reduce-scatter starts after its backward (beside the next layer's gather) and
  // completes before the next layer's backward, which needs the gradient slot.
  Work rs;
  int rs_layer = -1;
  int64_t rs_micro = 0;
  auto finish_rs = [&] {
    if (rs_layer < 0) return;
    wait(rs);
    const Piece& p = layer_piece(rs_layer);
    float* dst = grads_shard + p.off;
    if (rs_micro == 0) {
      std::copy(rs_tmp_.begin(), rs_tmp_.begin() + p.s, dst);
    } else {
      for (int64_t i = 0; i < p.s; ++i) dst[i] += rs_tmp_[static_cast<size_t>(i)];
    }
    put_slot(rs_layer, true);
    hold(-(p.hi - p.lo) * fbytes);
    rs_layer = -1;
  };

  auto& act = ws.act;
  auto& scratch = ws.scratch;
  const float* pt = tied_params_.data();
  double loss_sum = 0;
  int64_t t_fwd = 0, t_bwd = 0;
  for (const model::Unit& u : plan_.units()) {
    switch (u.kind) {
      case UnitKind::kBatch: {
        const train::RowRange rows = train::batch_rows(G, data_index, cfg_.data_parallel(), u.micro, M);
        data.train_batch(cfg_.workload.data_seed, step, G, cfg_.model.seq_len, rows.begin, rows.end, tokens);
        start_gather(0);
        t_fwd = now_us();
        break;
      }
      case UnitKind::kEmbedForward: model::embed_forward<float>(layout_, pt, tokens, act); break;
      case UnitKind::kBlockForward: {
        const int l = u.layer;
        need(l);
        model::block_forward<float>(layout_, slot_base(l, false), l, act, scratch, hooks.tp_reduce);
        if (l != L_ - 1) drop(l);  // the last layer's backward follows at once
        break;
      }
      case UnitKind::kHead:
        loss_sum += model::head_forward<float>(layout_, pt, tokens, act);
        if (hooks.moe && layout_.config().moe()) hooks.moe->add(act.moe_stats());
        t_bwd = now_us();
        span("forward", t_fwd, t_bwd);
        if (hooks.after_forward) hooks.after_forward(u.micro);
        model::head_backward<float>(layout_, pt, gt, tokens, grad_scale, act, scratch);
        break;
      case UnitKind::kBlockBackward: {
        const int l = u.layer;
        need(l);
        finish_rs();  // the gradient slot
        const Piece& p = layer_piece(l);
        float* g = take_slot(l, true);
        std::fill(g, g + p.s * D_, 0.0f);  // the padding too: the reduce-scatter reads it
        hold((p.hi - p.lo) * fbytes);
        model::block_backward<float>(layout_, slot_base(l, false), slot_base(l, true), l, act, scratch,
                                     hooks.tp_reduce);
        // Reads D * s floats from the layer's start: the padding was zeroed above.
        rs = dp_->ireduce_scatter(g, rs_tmp_.data(), static_cast<size_t>(p.s), DataType::kFloat32, ReduceOp::kSum);
        rs_layer = l;
        rs_micro = u.micro;
        if (!(l == 0 && u.micro < M - 1)) drop(l);  // layer 0 starts the next micro-batch
        start_gather(l - 1);
        break;
      }
      case UnitKind::kEmbedBackward:
        model::embed_backward<float>(layout_, gt, tokens, act);
        finish_rs();
        span("backward", t_bwd, now_us());
        break;
    }
  }
  finish_tied_grads(grads_shard);
  release_tied();
  if (replicas_ != nullptr && replicas_->size() > 1) {
    Work w = replicas_->iallreduce(grads_shard, grads_shard, static_cast<size_t>(shard_total_), DataType::kFloat32,
                                   ReduceOp::kSum);
    wait(w);
  }
  return loss_sum / static_cast<double>(M);
}

float* Fsdp::begin_tied_grads() {
  // The tied gradients accumulate over the micro-batches in full and are reduce-scattered once.
  const Piece &pe = pieces_.front(), &pf = pieces_.back();
  float* gt = tied_grads_.data();
  std::fill(gt + pe.lo, gt + pe.hi, 0.0f);
  std::fill(gt + pf.lo, gt + pf.hi, 0.0f);
  hold((pe.s + pf.s) * D_ * static_cast<int64_t>(sizeof(float)));
  return gt;
}

void Fsdp::finish_tied_grads(float* grads_shard) {
  ensure_rs_tmp();
  const Piece &pe = pieces_.front(), &pf = pieces_.back();
  float* gt = tied_grads_.data();
  for (const Piece* p : {&pe, &pf}) {
    Work w = dp_->ireduce_scatter(gt + p->lo, rs_tmp_.data(), static_cast<size_t>(p->s), DataType::kFloat32,
                                  ReduceOp::kSum);
    wait(w);
    std::copy(rs_tmp_.begin(), rs_tmp_.begin() + p->s, grads_shard + p->off);
    tied_grads_.release(p->lo, p->lo + p->s * D_);
  }
  hold(-(pe.s + pf.s) * D_ * static_cast<int64_t>(sizeof(float)));
}

double Fsdp::forward_loss(const float* params_shard, const int32_t* tokens, model::Workspace<float>& ws,
                          const model::TpReduce<float>& tp_reduce) {
  // model::forward_loss's calls, each layer gathered into the weight slot and released.
  const int64_t fbytes = sizeof(float);
  std::vector<Work> gathers(static_cast<size_t>(L_));
  auto start = [&](int l) {
    const Piece& p = layer_piece(l);
    gathers[l] = dp_->iallgather(params_shard + p.off, take_slot(l, false), static_cast<size_t>(p.s), DataType::kFloat32);
    hold(p.s * D_ * fbytes);
  };
  if (L_ > 0) start(0);
  model::embed_forward<float>(layout_, tied_params_.data(), tokens, ws.act);
  for (int l = 0; l < L_; ++l) {
    wait(gathers[l]);
    model::block_forward<float>(layout_, slot_base(l, false), l, ws.act, ws.scratch, tp_reduce);
    put_slot(l, false);
    hold(-layer_piece(l).s * D_ * fbytes);
    if (l + 1 < L_) start(l + 1);
  }
  return model::head_forward<float>(layout_, tied_params_.data(), tokens, ws.act);
}

double Fsdp::validation_loss_sum(const train::TextDataset& data, int data_index, const float* params_shard,
                                 model::Workspace<float>& ws, int32_t* tokens, const model::TpReduce<float>& tp_reduce) {
  // The loop of train::validation_loss_sum, over the same rows in the same order.
  const int64_t G = cfg_.workload.global_batch, T = cfg_.model.seq_len, b = cfg_.micro_batch();
  gather_tied(params_shard);
  double sum = 0;
  for (int64_t i = 0; i < train::validation_batches(cfg_, data); ++i)
    for (int64_t mb = 0; mb < cfg_.workload.microbatches; ++mb) {
      const train::RowRange rows = train::batch_rows(G, data_index, cfg_.data_parallel(), mb, cfg_.workload.microbatches);
      data.val_batch(i, G, T, rows.begin, rows.end, tokens);
      sum += forward_loss(params_shard, tokens, ws, tp_reduce) * static_cast<double>(b);
    }
  release_tied();
  return sum;
}

}  // namespace pwm::train
