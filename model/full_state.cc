#include "model/full_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sys/stat.h>

#include "common/check.h"
#include "common/time.h"
#include "common/trace.h"
#include "model/kernels.h"

namespace pwm::model {

std::vector<TensorData> gather_full(const ParamLayout& layout, const float* buffer,
                                    const TpGather& gather) {
  std::vector<TensorData> out;
  out.reserve(layout.params().size());
  for (const ParamInfo& p : layout.params()) {
    TensorData t{p.name, p.full_shape, std::vector<float>(static_cast<size_t>(p.full_size))};
    if (p.replicated() || layout.tp_size() == 1) {
      std::memcpy(t.values.data(), buffer + p.offset, sizeof(float) * p.size);
    } else {
      PWM_CHECK(gather != nullptr, "tp={} needs a gather function", layout.tp_size());
      gather(buffer + p.offset, t.values.data(), static_cast<size_t>(p.size));
    }
    out.push_back(std::move(t));
  }
  return out;
}

void scatter_full(const ParamLayout& layout, const std::vector<TensorData>& full, float* buffer) {
  for (const ParamInfo& p : layout.params()) {
    auto it = std::find_if(full.begin(), full.end(), [&](const TensorData& t) { return t.name == p.name; });
    if (it == full.end()) PWM_THROW("checkpoint has no tensor '{}'", p.name);
    if (it->shape != p.full_shape)
      PWM_THROW("checkpoint tensor '{}' has shape [{}] but the model needs [{}]", p.name,
                fmt::join(it->shape, ","), fmt::join(p.full_shape, ","));
    std::memcpy(buffer + p.offset, it->values.data() + p.full_offset, sizeof(float) * p.size);
  }
}

uint64_t weights_hash(const std::vector<TensorData>& full) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& t : full) {
    mix(t.name.data(), t.name.size());
    mix(t.shape.data(), t.shape.size() * sizeof(int64_t));
    mix(t.values.data(), t.values.size() * sizeof(float));
  }
  return h;
}

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

std::optional<Checkpoint> load_resume_checkpoint(const TrainConfig& cfg) {
  struct stat st;
  if (!cfg.resume || cfg.ckpt.empty() || ::stat(cfg.ckpt.c_str(), &st) != 0) return std::nullopt;
  Checkpoint ck = load_checkpoint(cfg.ckpt);
  check_compatible(ck, cfg.model);
  if (ck.train_config_json != cfg.workload_json())
    PWM_THROW("checkpoint {} was written by another workload (its training config is {}; this run's is {}): "
              "use the same flags or another --ckpt",
              cfg.ckpt, ck.train_config_json, cfg.workload_json());
  if (!ck.has_optimizer_state())
    PWM_THROW("checkpoint {} has no optimizer state: it cannot resume training", cfg.ckpt);
  if (ck.step > cfg.steps)
    PWM_THROW("checkpoint {} is at step {}, beyond --steps {}", cfg.ckpt, ck.step, cfg.steps);
  return ck;
}

std::unique_ptr<TextDataset> open_training_data(TrainConfig& cfg) {
  if (cfg.data.empty()) cfg.data = default_corpus_path();
  auto data = std::make_unique<TextDataset>(TextDataset::open(cfg.data, cfg.val_fraction));
  data->check_fits(cfg.model.seq_len);
  if (data->num_val_batches(cfg.global_batch, cfg.model.seq_len) < 1)
    PWM_THROW("--data {}: the validation split ({} bytes) holds fewer than --batch {} windows of {} tokens; "
              "use more data, a larger --val-fraction or a smaller --batch",
              cfg.data, data->val_size(), cfg.global_batch, cfg.model.seq_len + 1);
  return data;
}

void check_output_paths(const TrainConfig& cfg) {
  if (!cfg.metrics.empty()) check_writable("--metrics", cfg.metrics);
  if (!cfg.trace.empty()) check_writable("--trace", cfg.trace);
  if (!cfg.ckpt.empty()) check_writable("--ckpt", cfg.ckpt);
}

double measure_gemm_gflops(int64_t M, int64_t N, int64_t K, int reps, bool trans_a, bool trans_b) {
  std::vector<float> A(M * K), B(K * N), C(M * N);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : A) x = u(rng);
  for (auto& x : B) x = u(rng);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    gemm<float>(trans_a, trans_b, M, N, K, 1.0f, A.data(), trans_a ? M : K, B.data(), trans_b ? K : N, 0.0f,
                C.data(), N);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * M * N * K / best / 1e9;
}

}  // namespace pwm::model
