#include "train/config.h"

#include "model/kernels.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include <fmt/format.h>


#include "common/check.h"
#include "common/hash.h"
#include "model/config_fields.h"
#include "train/config_fields.h"
#include "train/model_json.h"

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

namespace {

// A real-valued flag's accepted range; `open_lo` / `open_hi` exclude the bound itself, an
// infinite bound is none. Every value must also be finite.
struct Range {
  const char* flag;
  double value, lo, hi;
  bool open_lo = false, open_hi = false;
};

void check_range(const Range& r) {
  const double v = r.value;
  const bool ok = std::isfinite(v) && (r.open_lo ? v > r.lo : v >= r.lo) && (r.open_hi ? v < r.hi : v <= r.hi);
  if (ok) return;
  if (std::isinf(r.hi))
    PWM_THROW("{} must be a finite number {} {} (got {})", r.flag, r.open_lo ? ">" : ">=", r.lo, v);
  PWM_THROW("{} must be in {}{}, {}{} (got {})", r.flag, r.open_lo ? "(" : "[", r.lo, r.hi, r.open_hi ? ")" : "]", v);
}

// A count's lower bound: "--steps must be at least 1 (got 0)", "--skip-nonfinite must be >= 0 (got -1)".
template <typename T>
void check_at_least(const char* flag, T v, double lo) {
  if (static_cast<double>(v) >= lo) return;
  if (lo == 0) PWM_THROW("{} must be >= 0 (got {})", flag, v);
  PWM_THROW("{} must be at least {} (got {})", flag, lo, v);
}

// A row's range (train/config_fields.h FieldRange): reals in range, counts at least their bound.
template <typename Part>
void check_field(const Part& p, const Field<Part>& f) {
  if (!f.range.bounded) return;
  const FieldRange& r = f.range;
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(p.*m)>;
        if constexpr (std::is_same_v<T, double>) check_range({f.flag, p.*m, r.lo, r.hi, r.open_lo, r.open_hi});
        else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) check_at_least(f.flag, p.*m, r.lo);
      },
      f.member);
}

// The flags' simple ranges, by their flag names (model::Config and AdamWConfig check the same
// fields under their own names, for callers without flags): the parts' rows, then the model's.
void check_flag_ranges(const TrainConfig& c) {
  for_each_part(c, [](const auto& part, const auto& rows, const char*) {
    for (const auto& f : rows) check_field(part, f);
  });
  for (const ConfigField& f : config_fields()) {
    if (!f.bounded) continue;
    if (const auto* m = std::get_if<int64_t Config::*>(&f.member)) check_at_least(f.flag, c.model.**m, f.lo);
    else if (const auto* d = std::get_if<double Config::*>(&f.member))
      check_range({f.flag, c.model.**d, f.lo, f.hi, f.open_lo, f.open_hi});
  }
  if (c.model.head_dim % 2 != 0) PWM_THROW("--head-dim must be even for rotary embeddings (got {})", c.model.head_dim);
  if (c.model.vocab > 65536) PWM_THROW("--vocab must be at most 65536 (got {})", c.model.vocab);
}

// The rows written at `level` (train/config_fields.h), each part's into its object; the texts
// below canonical_json hold an enum by its name, the MPMD settings are their flags' texts.
void put_fields(const TrainConfig& c, FieldJson level, nlohmann::json& j) {
  for_each_part(c, [&](const auto& part, const auto& rows, const char* object) {
    for (const auto& f : rows) {
      if (f.json != level || ((f.traits & kOmitDefault) && at_default(part, f))) continue;
      nlohmann::json& into = object != nullptr ? j[object] : j;
      into[f.key] = level == FieldJson::kTrainer ? nlohmann::json(field_text(part, f)) : field_json(part, f);
    }
  });
}

}  // namespace

void TrainConfig::validate(int world_size) const {
  const MeshConfig& m = mesh;
  const WorkloadConfig& w = workload;
  const OutputConfig& o = outputs;
  // The flags first: optim.total_steps is --steps, and the optimizer's own check would name it
  // by its internal name.
  check_flag_ranges(*this);
  if (optim.warmup_steps > w.steps)
    PWM_THROW("--warmup-steps {} is more than --steps {}: use fewer warm-up steps", optim.warmup_steps, w.steps);
  model.validate();
  optim.validate();
  if (m.replicas < 1 || m.dp < 1 || m.tp < 1)
    PWM_THROW("--replicas, --dp and --tp must be at least 1 (got replicas={} dp={} tp={})", m.replicas, m.dp, m.tp);
  if (m.fsdp && m.dp < 2) PWM_THROW("--fsdp shards over --dp, which is {}: use --dp 2 or more, or drop --fsdp", m.dp);
  if (mesh_ranks() != world_size)
    PWM_THROW("mesh --replicas {} x --dp {} x --tp {} = {} ranks, but the job has {} compute ranks: start it with {} "
              "compute ranks or change --replicas/--dp/--tp",
              m.replicas, m.dp, m.tp, mesh_ranks(), world_size, mesh_ranks());
  if (m.ep > 1 && m.dp % m.ep != 0)
    PWM_THROW("--expert-parallel {} must divide --dp {} (an expert-parallel group is {} consecutive dp ranks of a "
              "replica)",
              m.ep, m.dp, m.ep);
  if (m.ep > 1 && m.fsdp) PWM_THROW("--expert-parallel with --fsdp is not supported: drop one of them");
  model.validate_tp(m.tp, m.ep);
  if (w.global_batch < 1 || w.microbatches < 1)
    PWM_THROW("--batch and --microbatches must be at least 1 (got {} and {})", w.global_batch, w.microbatches);
  if (w.global_batch % (static_cast<int64_t>(data_parallel()) * w.microbatches) != 0)
    PWM_THROW("--batch {} is not divisible by --replicas {} x --dp {} x --microbatches {}: choose a multiple of {}",
              w.global_batch, m.replicas, m.dp, w.microbatches, static_cast<int64_t>(data_parallel()) * w.microbatches);
  if (w.eval_every < 0 || w.eval_batches < 1 || o.log_every < 1 || o.ckpt_every < 0)
    PWM_THROW("--eval-every/--ckpt-every must be >= 0 and --eval-batches/--log-every >= 1");
  if (o.ckpt_every > 0 && o.ckpt.empty()) PWM_THROW("--ckpt-every needs --ckpt PATH");
  if (o.resume && o.ckpt.empty()) PWM_THROW("--resume needs --ckpt PATH");
  if (exec.bucket_bytes != 0 && exec.bucket_bytes < 1024)
    PWM_THROW("--bucket-bytes must be 0 (sized from the model) or at least 1024 (got {})", exec.bucket_bytes);
}

void apply_precision(const TrainConfig& cfg) { set_precision(cfg.exec.precision); }

void TrainConfig::validate_kill_rank(int ranks) const {
  const int64_t steps = workload.steps;
  if (hooks.nan_step >= steps)
    PWM_THROW("--nan-step {} is never reached: the run has --steps {} (steps 0..{})", hooks.nan_step, steps, steps - 1);
  if (hooks.straggler_ms > 0 && (hooks.straggler_rank < 0 || hooks.straggler_rank >= ranks))
    PWM_THROW("--straggler-rank {} is not a rank of this job: choose one in [0, {})", hooks.straggler_rank, ranks);
  if (hooks.kill_step < 0) return;
  if (hooks.kill_step >= steps)
    PWM_THROW("--kill-step {} is never reached: the run has --steps {} (steps 0..{})", hooks.kill_step, steps, steps - 1);
  if (hooks.kill_rank < 0 || hooks.kill_rank >= ranks)
    PWM_THROW("--kill-rank {} is not a rank of this job: choose one in [0, {})", hooks.kill_rank, ranks);
}

std::string TrainConfig::canonical_json(bool mpmd_settings) const {
  nlohmann::json j = nlohmann::json::parse(to_json());
  j["model"] = model_to_json(model);  // field by field, so that a difference names the field
  put_fields(*this, FieldJson::kCanonical, j);
  if (mpmd_settings) put_fields(*this, FieldJson::kTrainer, j);
  return j.dump();  // nlohmann::json objects are sorted by key: one text per configuration
}

uint64_t config_hash(const std::string& canonical) {
  return fnv1a64(canonical);
}

void check_same_config(const std::vector<std::string>& canonical_by_rank) {
  std::vector<int> odd;
  for (size_t r = 1; r < canonical_by_rank.size(); ++r)
    if (canonical_by_rank[r] != canonical_by_rank[0]) odd.push_back(static_cast<int>(r));
  if (odd.empty()) return;
  std::string ranks;
  for (size_t i = 0; i < odd.size() && i < 8; ++i) {
    if (i) ranks += ',';
    ranks += std::to_string(odd[i]);
  }
  if (odd.size() > 8) ranks += ",...";
  PWM_THROW("rank{} {} started with other flags than rank 0 (rank {} vs rank 0: {}): start every rank with the "
            "same flags and config file",
            odd.size() > 1 ? "s" : "", ranks, odd[0],
            config_differences(canonical_by_rank[static_cast<size_t>(odd[0])], canonical_by_rank[0]));
}

std::string config_differences(const std::string& a, const std::string& b, size_t max_fields) {
  const nlohmann::json fa = nlohmann::json::parse(a).flatten(), fb = nlohmann::json::parse(b).flatten();
  std::vector<std::string> out;
  auto shown = [](const nlohmann::json& j, const std::string& k) { return j.contains(k) ? j.at(k).dump() : "(absent)"; };
  auto key = [](std::string k) { return k.substr(1); };  // "/optim/lr" -> "optim/lr"
  for (auto& [k, v] : fa.items())
    if (!fb.contains(k) || fb.at(k) != v) out.push_back(fmt::format("{}={} vs {}", key(k), shown(fa, k), shown(fb, k)));
  for (auto& [k, v] : fb.items())
    if (!fa.contains(k)) out.push_back(fmt::format("{}={} vs {}", key(k), shown(fa, k), shown(fb, k)));
  std::string s;
  for (size_t i = 0; i < out.size() && i < max_fields; ++i) s += (i ? ", " : "") + out[i];
  if (out.size() > max_fields) s += fmt::format(" (and {} more)", out.size() - max_fields);
  return s;
}

std::string TrainConfig::workload_json() const {
  nlohmann::json j;
  j["model"] = model.to_string();
  put_fields(*this, FieldJson::kWorkload, j);
  return j.dump();
}

std::string TrainConfig::to_json() const {
  nlohmann::json j = nlohmann::json::parse(workload_json());
  put_fields(*this, FieldJson::kRun, j);
  return j.dump();
}

}  // namespace pwm::train
