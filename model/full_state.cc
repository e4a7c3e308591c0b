#include "model/full_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "common/check.h"
#include "common/time.h"
#include "common/atomic_file.h"
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
  if (ck.train_config_json != cfg.workload_json()) {
    std::string diff;
    try {
      diff = config_differences(ck.train_config_json, cfg.workload_json());
    } catch (const std::exception&) {
      diff = "its training config is not readable";
    }
    PWM_THROW("checkpoint {} was written by another workload ({}; checkpoint vs this run; optim/total_steps is "
              "--steps): use the checkpoint's flags or another --ckpt",
              cfg.ckpt, diff);
  }
  if (!ck.has_optimizer_state())
    PWM_THROW("checkpoint {} has no optimizer state: it cannot resume training", cfg.ckpt);
  if (ck.step > cfg.steps)
    PWM_THROW("checkpoint {} is at step {}, beyond --steps {}", cfg.ckpt, ck.step, cfg.steps);
  return ck;
}

std::unique_ptr<TextDataset> open_training_data(TrainConfig& cfg) {
  if (cfg.data.empty()) cfg.data = default_corpus_path();
  auto data = std::make_unique<TextDataset>(TextDataset::open(cfg.data, cfg.val_fraction));
  // Tokens are bytes: every byte value must be a row of the embedding.
  const auto& b = data->bytes();
  unsigned char top = 0;
  for (char c : b) top = std::max(top, static_cast<unsigned char>(c));
  if (static_cast<int64_t>(top) >= cfg.model.vocab)
    PWM_THROW("--vocab {} is smaller than the data's symbols: --data {} holds byte value {}; use --vocab {} (or at "
              "least {})",
              cfg.model.vocab, cfg.data, static_cast<int>(top), 256, static_cast<int>(top) + 1);
  data->check_fits(cfg.model.seq_len);
  if (data->num_val_batches(cfg.global_batch, cfg.model.seq_len) < 1)
    PWM_THROW("--data {}: the validation split ({} bytes) holds fewer than --batch {} windows of {} tokens; "
              "use more data, a larger --val-fraction or a smaller --batch",
              cfg.data, data->val_size(), cfg.global_batch, cfg.model.seq_len + 1);
  return data;
}

void check_output_paths(const TrainConfig& cfg) {
  if (!cfg.metrics.empty()) check_output_path("--metrics", cfg.metrics);
  if (!cfg.trace.empty()) check_output_path("--trace", cfg.trace);
  if (!cfg.ckpt.empty()) check_output_path("--ckpt", cfg.ckpt);
}

double estimated_memory_bytes(const TrainConfig& cfg) {
  // In doubles: a config given by mistake (--seq-len 1e9) must not overflow into a small number.
  const Config& m = cfg.model;
  const double C = m.d_model, L = m.n_layers, H = m.n_heads, D = m.head_dim, F = m.d_ff, V = m.vocab,
               T = m.seq_len, tp = cfg.tp;
  const double B = static_cast<double>(cfg.global_batch) / cfg.data_parallel() / std::max<int64_t>(cfg.microbatches, 1);
  const double N = B * T, Hs = H / tp;
  const double per_layer = C + C * H * D + 2 * C * D + H * D * C + 3 * C * F;
  const double params = (V * C + L * per_layer + C) / tp;
  // Parameters, gradients, AdamW m and v (with --fsdp a 1/dp shard of each; the gathered layers
  // are left out: this is a lower estimate).
  const double state = 4 * params / (cfg.fsdp ? cfg.dp : 1);
  // Saved activations per layer (model::Activations::layer_elements: norms, x, the fused input
  // projection, attention output, the T x T scores per head, the MLP's hidden rows), the head's
  // probabilities, and the working copies of x.
  const double layer = 2 * N + N * C + N * (Hs + 2) * D + N * Hs * D + N * D + B * Hs * T * T + N * 2 * F / tp;
  const double act = L * layer + N * V + 4 * N * C + T * D;
  return 4.0 * (state + act);  // float32
}

double available_memory_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) return static_cast<double>(kb) * 1024.0;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : -1.0;
}

void check_memory(const TrainConfig& cfg, int ranks_on_host) {
  const double per_rank = estimated_memory_bytes(cfg), need = per_rank * std::max(ranks_on_host, 1);
  const double have = available_memory_bytes();
  if (have < 0 || need <= have) return;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  PWM_THROW("this run needs about {:.1f} GiB of memory ({:.1f} GiB per rank x {} ranks on this host: parameters, "
            "gradients, AdamW moments and activations) but this host has {:.1f} GiB available: use a smaller "
            "--seq-len, --batch or model, more --microbatches, or more hosts",
            need / GiB, per_rank / GiB, ranks_on_host, have / GiB);
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
