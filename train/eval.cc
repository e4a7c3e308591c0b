#include "train/eval.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "common/check.h"
#include "model/transformer.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

std::vector<float> params_from_checkpoint(const Checkpoint& ckpt, const ParamLayout& layout) {
  std::vector<float> params(static_cast<size_t>(layout.total()));
  for (const ParamInfo& p : layout.params()) {
    const TensorData& t = ckpt.param(p.name);
    if (t.shape != p.full_shape)
      PWM_THROW("checkpoint {}: tensor {} has shape [{}] but the model expects [{}]", ckpt.path,
                p.name, fmt::join(t.shape, ", "), fmt::join(p.full_shape, ", "));
    std::copy_n(t.values.begin() + p.full_offset, p.size, params.begin() + p.offset);
  }
  if (ckpt.params.size() != layout.params().size())
    PWM_THROW("checkpoint {}: holds {} tensors but the model has {}", ckpt.path,
              ckpt.params.size(), layout.params().size());
  return params;
}

EvalResult evaluate_bytes(const ParamLayout& layout, const float* params, const std::string& bytes,
                          int64_t batch, int64_t max_windows) {
  const Config& cfg = layout.config();
  const int64_t T = cfg.seq_len, V = cfg.vocab;
  PWM_CHECK_EQ(layout.tp_size(), 1);
  if (batch < 1) PWM_THROW("evaluation batch must be >= 1 (got {})", batch);
  if (V < 256) PWM_THROW("evaluating bytes needs vocab >= 256 (model has {})", V);
  const int64_t size = static_cast<int64_t>(bytes.size());
  int64_t windows = size > 0 ? (size - 1) / T : 0;
  if (max_windows > 0) windows = std::min(windows, max_windows);
  if (windows == 0)
    PWM_THROW("text of {} bytes is too short: need at least seq_len + 1 = {}", size, T + 1);

  EvalResult r;
  r.windows = windows;
  r.tokens = windows * T;
  double sum_loss = 0, sum_xent = 0;
  std::unique_ptr<Workspace<float>> ws;
  std::vector<int32_t> tokens;
  for (int64_t done = 0; done < windows;) {
    const int64_t B = std::min(batch, windows - done);
    if (!ws || ws->act.B() != B) ws = std::make_unique<Workspace<float>>(layout, B);
    tokens.resize(static_cast<size_t>(B * (T + 1)));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t <= T; ++t)
        tokens[b * (T + 1) + t] = static_cast<unsigned char>(bytes[(done + b) * T + t]);
    const float loss = forward_loss<float>(layout, params, tokens.data(), B, *ws, {});
    sum_loss += static_cast<double>(loss) * static_cast<double>(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int32_t y = tokens[b * (T + 1) + t + 1];
        // -log p = lse - logit; p from the stored softmax, floored to avoid log(0).
        const double p = ws->act.probs[(b * T + t) * V + y];
        sum_xent -= std::log(std::max(p, 1e-30));
      }
    done += B;
  }
  r.xent = sum_xent / static_cast<double>(r.tokens);
  r.loss = sum_loss / static_cast<double>(r.tokens);
  return r;
}

}  // namespace pwm::train
