#include "train/checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/time.h"
#include "model/kernels.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

std::optional<Checkpoint> load_resume_checkpoint(const TrainConfig& cfg) {
  struct stat st;
  if (!cfg.outputs.resume || cfg.outputs.ckpt.empty() || ::stat(cfg.outputs.ckpt.c_str(), &st) != 0) return std::nullopt;
  Checkpoint ck = load_checkpoint(cfg.outputs.ckpt);
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
              cfg.outputs.ckpt, diff);
  }
  if (!ck.has_optimizer_state())
    PWM_THROW("checkpoint {} has no optimizer state: it cannot resume training", cfg.outputs.ckpt);
  check_finite(ck, /*moments=*/true);
  if (ck.step > cfg.workload.steps)
    PWM_THROW("checkpoint {} is at step {}, beyond --steps {}", cfg.outputs.ckpt, ck.step, cfg.workload.steps);
  return ck;
}

std::unique_ptr<TextDataset> open_training_data(TrainConfig& cfg) {
  if (cfg.workload.data.empty()) cfg.workload.data = default_corpus_path();
  auto data = std::make_unique<TextDataset>(TextDataset::open(cfg.workload.data, cfg.workload.val_fraction));
  // Tokens are bytes: every byte value must be a row of the embedding.
  const auto& b = data->bytes();
  unsigned char top = 0;
  for (char c : b) top = std::max(top, static_cast<unsigned char>(c));
  if (static_cast<int64_t>(top) >= cfg.model.vocab)
    PWM_THROW("--vocab {} is smaller than the data's symbols: --data {} holds byte value {}; use --vocab {} (or at "
              "least {})",
              cfg.model.vocab, cfg.workload.data, static_cast<int>(top), 256, static_cast<int>(top) + 1);
  data->check_fits(cfg.model.seq_len);
  if (data->num_val_batches(cfg.workload.global_batch, cfg.model.seq_len) < 1)
    PWM_THROW("--data {}: the validation split ({} bytes) holds fewer than --batch {} windows of {} tokens; "
              "use more data, a larger --val-fraction or a smaller --batch",
              cfg.workload.data, data->val_size(), cfg.workload.global_batch, cfg.model.seq_len + 1);
  return data;
}

void check_output_paths(const TrainConfig& cfg) {
  if (!cfg.outputs.metrics.empty()) check_output_path("--metrics", cfg.outputs.metrics);
  if (!cfg.outputs.trace.empty()) check_output_path("--trace", cfg.outputs.trace);
  if (!cfg.outputs.ckpt.empty()) check_output_path("--ckpt", cfg.outputs.ckpt);
}

double estimated_memory_bytes(const TrainConfig& cfg) {
  // In doubles: a config given by mistake (--seq-len 1e9) must not overflow into a small number.
  const Config& m = cfg.model;
  const double C = m.d_model, L = m.n_layers, H = m.n_heads, D = m.head_dim, F = m.d_ff, V = m.vocab,
               T = m.seq_len, tp = cfg.mesh.tp;
  const double B = static_cast<double>(cfg.workload.global_batch) / cfg.data_parallel() / std::max<int64_t>(cfg.workload.microbatches, 1);
  const double N = B * T, Hs = H / tp;
  const double per_layer = C + C * H * D + 2 * C * D + H * D * C + 3 * C * F;
  const double params = (V * C + L * per_layer + C) / tp;
  // Parameters, gradients, AdamW m and v (with --fsdp a 1/dp shard of each; the gathered layers
  // are left out: this is a lower estimate).
  const double state = 4 * params / (cfg.mesh.fsdp ? cfg.mesh.dp : 1);
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

}  // namespace pwm::train
