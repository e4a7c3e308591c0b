// The step plan (model/step_plan.h): its unit order against the order written out by hand, its
// executor (accumulate_gradients) against model::forward_backward called per micro-batch, the
// pipeline's partition against the whole plan, and per-tensor arithmetic over gradient pieces
// (GradView) against the contiguous buffer.
#include <gtest/gtest.h>

#include <cstring>

#include "common/check.h"
#include "train/data.h"
#include "model/optim.h"
#include "model/step_plan.h"
#include "train/step.h"
#include "tests/model/model_test_util.h"

namespace pwm::model {

using namespace ::pwm::train;  // the trainers' toolkit (train/)
namespace {

using K = UnitKind;

TEST(StepPlan, UnitsInTheOrderOfForwardBackward) {
  const ParamLayout layout(testing::tiny_config(), 0, 1);  // 2 layers
  const StepPlan plan(layout, 2);
  std::vector<Unit> want;
  for (int64_t m = 0; m < 2; ++m) {
    want.insert(want.end(), {{K::kBatch, m}, {K::kEmbedForward, m}, {K::kBlockForward, m, 0}, {K::kBlockForward, m, 1},
                             {K::kHead, m}, {K::kBlockBackward, m, 1}, {K::kBlockBackward, m, 0}, {K::kEmbedBackward, m}});
  }
  EXPECT_EQ(plan.units(), want);
}

TEST(StepPlan, StagesPartitionTheUnits) {
  Config c = testing::tiny_config();
  c.n_layers = 3;
  const ParamLayout layout(c, 0, 1);
  const StepPlan plan(layout, 1);
  // Stage 0: layers [0, 1) with the batch and the embedding; stage 1: [1, 3) with the head,
  // which reads the batch's targets again.
  const std::vector<Unit> f0 = plan.forward_units(0, 0, 1), f1 = plan.forward_units(0, 1, 3);
  EXPECT_EQ(f0, (std::vector<Unit>{{K::kBatch, 0}, {K::kEmbedForward, 0}, {K::kBlockForward, 0, 0}}));
  EXPECT_EQ(f1, (std::vector<Unit>{{K::kBlockForward, 0, 1}, {K::kBlockForward, 0, 2}, {K::kBatch, 0}, {K::kHead, 0}}));
  EXPECT_EQ(plan.backward_units(0, 1, 3), (std::vector<Unit>{{K::kBlockBackward, 0, 2}, {K::kBlockBackward, 0, 1}}));
  EXPECT_EQ(plan.backward_units(0, 0, 1), (std::vector<Unit>{{K::kBlockBackward, 0, 0}, {K::kEmbedBackward, 0}}));
}

TEST(StepPlan, PiecesAndFinishOrderCoverTheBufferOnce) {
  for (int tp : {1, 2}) {
    const ParamLayout layout(testing::tiny_config(), tp - 1, tp);
    const StepPlan plan(layout, 1);
    std::vector<int> covered(static_cast<size_t>(layout.total()), 0), finished = covered;
    for (int p = 0; p < plan.num_pieces(); ++p)
      for (const auto& [lo, hi] : plan.piece_ranges(p))
        for (int64_t i = lo; i < hi; ++i) covered[static_cast<size_t>(i)]++;
    for (const auto& [lo, hi] : plan.finish_order())
      for (int64_t i = lo; i < hi; ++i) finished[static_cast<size_t>(i)]++;
    EXPECT_EQ(covered, std::vector<int>(covered.size(), 1));
    EXPECT_EQ(finished, std::vector<int>(finished.size(), 1));
    // Finished after head: final_norm (the buffer's end); after the last unit: embed (its start).
    EXPECT_EQ(plan.finish_order().front().second, layout.total());
    EXPECT_EQ(plan.finish_order().back().first, 0);
    EXPECT_EQ(plan.piece_size(StepPlan::kTiedPiece), layout.get("embed").size + layout.config().d_model);
  }
}

TEST(StepPlan, ExecutorMatchesForwardBackwardPerMicroBatch) {
  TrainConfig cfg;
  cfg.model = testing::tiny_config();
  cfg.model.vocab = 256;  // bytes
  cfg.workload.global_batch = 4;
  cfg.workload.microbatches = 2;
  const TextDataset data(generate_corpus(3, 20000), "generated");
  const ParamLayout layout(cfg.model, 0, 1);
  const StepPlan plan(layout, cfg.workload.microbatches);
  std::vector<float> params(static_cast<size_t>(layout.total())), grads(params.size()), ref(params.size(), 0.0f);
  init_params(layout, 11, params.data());
  Workspace<float> ws(layout, cfg.micro_batch());
  std::vector<int32_t> tokens(static_cast<size_t>(cfg.micro_batch() * (cfg.model.seq_len + 1)));
  std::vector<int> done;
  StepHooks hooks;
  hooks.unit_done = [&done](int i) { done.push_back(i); };
  const int64_t step = 5;
  const double loss = accumulate_gradients(cfg, layout, plan, data, step, 0, params.data(), grads.data(), ws,
                                           tokens.data(), hooks);
  // The independent composition: model::forward_backward per micro-batch, same scale.
  double ref_loss = 0;
  for (int64_t m = 0; m < cfg.workload.microbatches; ++m) {
    const RowRange rows = batch_rows(cfg.workload.global_batch, 0, 1, m, cfg.workload.microbatches);
    data.train_batch(cfg.workload.data_seed, step, cfg.workload.global_batch, cfg.model.seq_len, rows.begin, rows.end, tokens.data());
    ref_loss += forward_backward<float>(layout, params.data(), ref.data(), tokens.data(), cfg.micro_batch(), 0.5f, ws, {});
  }
  EXPECT_EQ(loss, ref_loss / 2);
  EXPECT_EQ(0, std::memcmp(grads.data(), ref.data(), sizeof(float) * grads.size()));
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2, 3}));  // the last micro-batch only, in finish order
}

TEST(GradView, PiecesGiveTheContiguousBits) {
  TrainConfig cfg;
  cfg.model = testing::tiny_config();
  const ParamLayout layout(cfg.model, 1, 2);
  const StepPlan plan(layout, 1);
  std::vector<float> p(static_cast<size_t>(layout.total())), g(p.size()), m(p.size(), 0.01f), v(p.size(), 0.02f);
  init_params(layout, 1, p.data());
  init_params(layout, 2, g.data());
  // Each piece copied into storage of its own, its ranges back to back.
  std::vector<std::vector<float>> store(static_cast<size_t>(plan.num_pieces()));
  GradView view;
  for (int i = 0; i < plan.num_pieces(); ++i) {
    for (const auto& [lo, hi] : plan.piece_ranges(i)) store[i].insert(store[i].end(), g.begin() + lo, g.begin() + hi);
    view.add(plan.piece_ranges(i), store[i].data());
  }
  EXPECT_EQ(grad_sq_norm_tp(layout, view), grad_sq_norm_tp(layout, g.data()));
  std::vector<float> pa(p.size()), ma(p.size()), va(p.size()), pb = pa, mb = pa, vb = pa;
  apply_update_into(cfg, layout, 3, 2.0, p.data(), g.data(), m.data(), v.data(), pa.data(), ma.data(), va.data());
  apply_update_into(cfg, layout, 3, 2.0, p.data(), view, m.data(), v.data(), pb.data(), mb.data(), vb.data());
  EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), sizeof(float) * pa.size()));
  EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), sizeof(float) * va.size()));
  GradView one_piece;
  one_piece.add(plan.piece_ranges(StepPlan::layer_piece(0)), store[1].data());
  EXPECT_THROW(one_piece.at(0, 1), pwm::Error);  // the embedding is not in layer 0's piece
}

}  // namespace
}  // namespace pwm::model
