#include "train/checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <random>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/paths.h"
#include "common/time.h"
#include "model/kernels.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

std::optional<Checkpoint> load_resume_checkpoint(const TrainConfig& cfg) {
  struct stat st;
  if (!cfg.outputs.resume || cfg.outputs.ckpt.empty() || ::lstat(cfg.outputs.ckpt.c_str(), &st) != 0) return std::nullopt;
  check_input_file("--resume: --ckpt", cfg.outputs.ckpt, UINTMAX_MAX);  // never a FIFO, whoever calls
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

std::vector<NamedPath> output_paths(const TrainConfig& cfg, const std::vector<NamedPath>& more) {
  std::vector<NamedPath> out;
  if (!cfg.outputs.metrics.empty()) out.emplace_back("--metrics", cfg.outputs.metrics);
  if (!cfg.outputs.trace.empty()) out.emplace_back("--trace", cfg.outputs.trace);
  if (!cfg.outputs.ckpt.empty()) out.emplace_back("--ckpt", cfg.outputs.ckpt);
  for (const NamedPath& p : more)
    if (!p.second.empty()) out.push_back(p);
  return out;
}

namespace {

// An output that would overwrite an input, or land in the data directory (where the next run
// would read it as training data), is refused before anything is written.
void check_not_an_input(const NamedPath& o, const TrainConfig& cfg) {
  const std::string& data = cfg.workload.data;
  if (same_file(o.second, data))
    PWM_THROW("{} {} is the training data (--data {}): it would be overwritten; write the output elsewhere", o.first,
              o.second, data);
  if (inside_directory(o.second, data))
    PWM_THROW("{} {} lies inside the training data directory (--data {}), where the next run would read it as "
              "training data: write the output elsewhere",
              o.first, o.second, data);
  if (!cfg.config_file.empty() && same_file(o.second, cfg.config_file))
    PWM_THROW("{} {} is the config file (--config {}): it would be overwritten; write the output elsewhere", o.first,
              o.second, cfg.config_file);
}

}  // namespace

uint64_t check_paths(TrainConfig& cfg, const std::vector<NamedPath>& outputs) {
  if (cfg.workload.data.empty()) cfg.workload.data = default_corpus_path();
  const uint64_t data_bytes = TextDataset::size_on_disk(cfg.workload.data);
  struct stat st;
  const std::string& ck = cfg.outputs.ckpt;
  if (cfg.outputs.resume && !ck.empty() && ::lstat(ck.c_str(), &st) == 0) {
    // Read whole, then parsed into tensors: about twice its size while it loads.
    const double have = available_memory_bytes();
    const uintmax_t cap = have > 0 ? static_cast<uintmax_t>(have / 2) : UINTMAX_MAX;
    check_input_file("--resume: --ckpt", ck, cap);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (same_file(outputs[i].second, outputs[j].second))
        PWM_THROW("{} {} and {} {} are the same file: give each output its own path", outputs[j].first,
                  outputs[j].second, outputs[i].first, outputs[i].second);
    check_not_an_input(outputs[i], cfg);
  }
  return data_bytes;
}

void check_output_paths(const std::vector<NamedPath>& outputs) {
  for (const auto& [flag, path] : outputs) check_output_path(flag, path);
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

void check_memory(const TrainConfig& cfg, int ranks_on_host, double data_bytes, bool mpmd) {
  const MemoryEstimate e = estimate_memory(cfg, mpmd);
  const double per_rank = e.total(), need = per_rank * std::max(ranks_on_host, 1) + data_bytes;
  const double have = available_memory_bytes();
  if (have < 0 || need <= have) return;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  PWM_THROW("this run needs about {:.1f} GiB of memory ({:.1f} GiB per rank x {} ranks on this host: {:.1f} model "
            "state, {:.1f} activations{}{}{}{}; {:.1f} GiB of training data held by the ranks) but this host has {:.1f} "
            "GiB available: use a smaller --seq-len, --batch, model{} or --data, more --microbatches, or more hosts",
            need / GiB, per_rank / GiB, ranks_on_host, e.state / GiB, (e.activations + e.in_flight) / GiB,
            e.moe > 0 ? fmt::format(", {:.1f} MoE rows", e.moe / GiB) : "",
            e.gathers > 0 ? fmt::format(", {:.1f} FSDP gathers", e.gathers / GiB) : "",
            e.in_flight > 0 ? fmt::format(" ({:.1f} of them the pipeline's micro-batches in flight)", e.in_flight / GiB)
                            : "",
            e.runtime > 0 ? fmt::format(", {:.1f} the runtime's intermediates", e.runtime / GiB) : "",
            data_bytes / GiB, have / GiB, cfg.model.moe() ? ", fewer --experts, a lower --capacity-factor" : "");
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
