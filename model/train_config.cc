#include "model/train_config.h"

#include "model/kernels.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <fstream>
#include <iterator>

#include "common/check.h"

namespace pwm::model {

void add_train_flags(CLI::App& app, TrainConfig& c) {
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  const char* M = "Model";
  app.add_option("--d-model", c.model.d_model, "model width C")->group(M);
  app.add_option("--layers", c.model.n_layers, "Transformer blocks L")->group(M);
  app.add_option("--heads", c.model.n_heads, "query heads H (one shared K/V head)")->group(M);
  app.add_option("--head-dim", c.model.head_dim, "head dimension D")->group(M);
  app.add_option("--d-ff", c.model.d_ff, "SwiGLU hidden width F")->group(M);
  app.add_option("--vocab", c.model.vocab, "vocabulary (256 = bytes)")->group(M);
  app.add_option("--seq-len", c.model.seq_len, "sequence length T")->group(M);
  app.add_option("--z-loss", c.model.z_loss, "z-loss coefficient")->group(M);
  app.add_option("--rope-base", c.model.rope_base, "rotary embedding base")->group(M);
  app.add_option_function<std::string>(
         "--norm", [&c](const std::string& s) { c.model.norm = parse_norm(s); },
         "layernorm | rmsnorm (default layernorm)")
      ->group(M);
  app.add_option("--seed", c.model.seed, "parameter initialization seed")->group(M);

  const char* O = "Optimizer (AdamW, warm-up + cosine)";
  app.add_option("--lr", c.optim.lr, "peak learning rate")->group(O);
  app.add_option("--beta1", c.optim.beta1)->group(O);
  app.add_option("--beta2", c.optim.beta2)->group(O);
  app.add_option("--eps", c.optim.eps)->group(O);
  app.add_option("--weight-decay", c.optim.weight_decay, "decoupled decay (matrices, embedding)")->group(O);
  app.add_option("--max-grad-norm", c.optim.max_grad_norm, "global-norm clipping (<= 0: off)")->group(O);
  app.add_option("--warmup-steps", c.optim.warmup_steps)->group(O);
  app.add_option("--min-lr-frac", c.optim.min_lr_frac, "cosine floor as a fraction of --lr")->group(O);

  const char* W = "Workload";
  app.add_option("--replicas", c.replicas, "model replicas, one per island (data parallel across islands)")->group(W);
  app.add_option("--dp", c.dp, "data-parallel ranks inside a replica")->group(W);
  app.add_option("--tp", c.tp, "tensor-parallel ranks (adjacent world ranks)")->group(W);
  app.add_flag("--fsdp,!--no-fsdp", c.fsdp, "shard parameters, gradients and AdamW moments over --dp (ZeRO-3)")->group(W);
  app.add_option("--replica-reduce", c.replica_reduce,
                 "spmd_train with --replicas > 1: hierarchical (reduce-scatter, cross-replica allreduce, allgather) or flat")
      ->check(CLI::IsMember({"hierarchical", "flat"}))->group(W);
  app.add_option("--batch", c.global_batch, "global batch in sequences per optimizer step")->group(W);
  app.add_option("--microbatches", c.microbatches, "gradient-accumulation micro-batches per dp rank")->group(W);
  app.add_option("--steps", c.steps, "optimizer steps (also the cosine schedule's length)")->group(W);
  app.add_option("--data-seed", c.data_seed, "seed of the batch sampler")->group(W);
  app.add_option("--data", c.data, "text file or directory (default: /usr/share/common-licenses)")->group(W);
  app.add_option("--val-fraction", c.val_fraction, "share of the data held out for validation")->group(W);
  app.add_option("--eval-every", c.eval_every, "validation loss every N steps (0: at the end only)")->group(W);
  app.add_option("--eval-batches", c.eval_batches, "validation batches per evaluation")->group(W);

  const char* U = "Outputs";
  app.add_option("--log-every", c.log_every, "progress line every N steps (rank 0)")->group(U);
  app.add_option("--metrics", c.metrics, "JSON-lines metrics file")->group(U);
  app.add_option("--trace", c.trace, "Chrome/Perfetto trace file merged from all ranks")->group(U);
  app.add_option("--ckpt", c.ckpt, "checkpoint file (written every --ckpt-every steps and at the end)")->group(U);
  app.add_option("--ckpt-every", c.ckpt_every, "checkpoint every N steps (0: at the end only)")->group(U);
  app.add_flag("--resume", c.resume, "resume from --ckpt when it exists")->group(U);

  const char* E = "Execution";
  app.add_option("--bucket-bytes", c.bucket_bytes, "gradient AllReduce bucket (fusion buffer) size in bytes (0: sized from the model)")->group(E);
  app.add_flag("--overlap,!--no-overlap", c.overlap, "overlap bucket AllReduces with backward")->group(E);
  app.add_option("--coll-timeout", c.coll_timeout, "collectives watchdog timeout, seconds")->group(E);
  app.add_option("--peak-gflops", c.peak_gflops, "per-rank GEMM peak for MFU (0: measure)")->group(E);
  app.add_option("--precision", c.precision, "matrix products: fp32, or bf16 with fp32 sums (oneDNN)")
      ->check(CLI::IsMember({"fp32", "bf16"}))->group(E);

  const char* T = "Testing";
  app.add_option("--kill-step", c.kill_step, "SIGKILL --kill-rank in the middle of this step")->group(T);
  app.add_option("--kill-rank", c.kill_rank)->group(T);
  app.add_option("--step-sleep-ms", c.step_sleep_ms, "sleep after every step (kill tests)")->group(T);
}

namespace {

// JSON config -> "--key=value" arguments, so that the file and the flags share one parser.
std::vector<std::string> json_to_args(std::string_view text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    PWM_THROW("--config {} is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) PWM_THROW("--config {} must hold one JSON object of flag names to values", path);
  std::vector<std::string> args;
  for (auto& [key, v] : j.items()) {
    std::string val;
    if (v.is_string()) val = v.get<std::string>();
    else if (v.is_boolean()) val = v.get<bool>() ? "true" : "false";
    else if (v.is_number()) val = v.dump();
    else PWM_THROW("--config {}: key '{}' must be a string, number or boolean", path, key);
    args.push_back("--" + key + "=" + val);
  }
  return args;
}

}  // namespace

void load_train_config_file(const std::string& path, TrainConfig& cfg) {
  std::ifstream in(path);
  if (!in) PWM_THROW("cannot read --config {}: check the path", path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) PWM_THROW("cannot read --config {}: check the path", path);
  parse_train_config_text(text, path, cfg);
}

void parse_train_config_text(std::string_view text, const std::string& path, TrainConfig& cfg) {
  CLI::App app;
  add_train_flags(app, cfg);
  auto args = json_to_args(text, path);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    PWM_THROW("--config {}: {}", path, e.what());
  }
}

bool parse_train_config(int argc, char** argv, const std::string& program,
                        const std::string& description, TrainConfig& cfg, int& exit_code,
                        bool print_help, const std::function<void(CLI::App&)>& more_flags) {
  // --config first, so that flags on the command line override the file.
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) load_train_config_file(argv[i + 1], cfg);
    else if (a.rfind("--config=", 0) == 0) load_train_config_file(a.substr(9), cfg);
  }
  CLI::App app{description, program};
  std::string config_path;
  app.add_option("--config", config_path, "JSON file of flag values (flags override it)");
  add_train_flags(app, cfg);
  if (more_flags) more_flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    exit_code = print_help ? app.exit(e) : 0;
    return false;
  } catch (const CLI::ParseError& e) {
    PWM_THROW("{} (see {} --help)", e.what(), program);
  }
  cfg.optim.total_steps = cfg.steps;
  return true;
}

void TrainConfig::validate(int world_size) const {
  // The flags first: optim.total_steps is --steps, and the optimizer's own check would name it
  // by its internal name.
  if (steps < 1) PWM_THROW("--steps must be at least 1 (got {})", steps);
  if (optim.warmup_steps > steps)
    PWM_THROW("--warmup-steps {} is more than --steps {}: use fewer warm-up steps", optim.warmup_steps, steps);
  model.validate();
  optim.validate();
  if (replicas < 1 || dp < 1 || tp < 1)
    PWM_THROW("--replicas, --dp and --tp must be at least 1 (got replicas={} dp={} tp={})", replicas, dp, tp);
  if (replica_reduce != "hierarchical" && replica_reduce != "flat")
    PWM_THROW("--replica-reduce must be hierarchical or flat (got '{}')", replica_reduce);
  if (fsdp && dp < 2) PWM_THROW("--fsdp shards over --dp, which is {}: use --dp 2 or more, or drop --fsdp", dp);
  if (mesh_ranks() != world_size)
    PWM_THROW("mesh --replicas {} x --dp {} x --tp {} = {} ranks, but the job has {} compute ranks: start it with {} "
              "compute ranks or change --replicas/--dp/--tp",
              replicas, dp, tp, mesh_ranks(), world_size, mesh_ranks());
  model.validate_tp(tp);
  if (global_batch < 1 || microbatches < 1)
    PWM_THROW("--batch and --microbatches must be at least 1 (got {} and {})", global_batch, microbatches);
  if (global_batch % (static_cast<int64_t>(data_parallel()) * microbatches) != 0)
    PWM_THROW("--batch {} is not divisible by --replicas {} x --dp {} x --microbatches {}: choose a multiple of {}",
              global_batch, replicas, dp, microbatches, static_cast<int64_t>(data_parallel()) * microbatches);
  if (!(val_fraction > 0 && val_fraction < 1))
    PWM_THROW("--val-fraction must be in (0, 1) (got {})", val_fraction);
  if (eval_every < 0 || eval_batches < 1 || log_every < 1 || ckpt_every < 0)
    PWM_THROW("--eval-every/--ckpt-every must be >= 0 and --eval-batches/--log-every >= 1");
  if (ckpt_every > 0 && ckpt.empty()) PWM_THROW("--ckpt-every needs --ckpt PATH");
  if (resume && ckpt.empty()) PWM_THROW("--resume needs --ckpt PATH");
  if (bucket_bytes != 0 && bucket_bytes < 1024)
    PWM_THROW("--bucket-bytes must be 0 (sized from the model) or at least 1024 (got {})", bucket_bytes);
  if (!(coll_timeout > 0)) PWM_THROW("--coll-timeout must be positive (got {})", coll_timeout);
  if (step_sleep_ms < 0) PWM_THROW("--step-sleep-ms must be >= 0 (got {})", step_sleep_ms);
}

void apply_precision(const TrainConfig& cfg) { set_precision(parse_precision(cfg.precision)); }

void TrainConfig::validate_kill_rank(int ranks) const {
  if (kill_step < 0) return;
  if (kill_step >= steps)
    PWM_THROW("--kill-step {} is never reached: the run has --steps {} (steps 0..{})", kill_step, steps, steps - 1);
  if (kill_rank < 0 || kill_rank >= ranks)
    PWM_THROW("--kill-rank {} is not a rank of this job: choose one in [0, {})", kill_rank, ranks);
}

std::string TrainConfig::canonical_json(const std::map<std::string, std::string>& extra) const {
  nlohmann::json j = nlohmann::json::parse(to_json());
  const Config& m = model;  // field by field, so that a difference names the field
  j["model"] = {{"d_model", m.d_model}, {"n_layers", m.n_layers}, {"n_heads", m.n_heads}, {"head_dim", m.head_dim},
                {"d_ff", m.d_ff},       {"vocab", m.vocab},       {"seq_len", m.seq_len}, {"z_loss", m.z_loss},
                {"rope_base", m.rope_base}, {"norm", norm_name(m.norm)}, {"seed", m.seed}};
  j["global_batch"] = global_batch;
  j["log_every"] = log_every;
  j["metrics"] = metrics;
  j["trace"] = trace;
  j["ckpt"] = ckpt;
  j["ckpt_every"] = ckpt_every;
  j["resume"] = resume;
  j["coll_timeout"] = coll_timeout;
  j["peak_gflops"] = peak_gflops;
  j["kill_step"] = kill_step;
  j["kill_rank"] = kill_rank;
  j["step_sleep_ms"] = step_sleep_ms;
  for (const auto& [k, v] : extra) j["trainer"][k] = v;
  return j.dump();  // nlohmann::json objects are sorted by key: one text per configuration
}

uint64_t config_hash(const std::string& canonical) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : canonical) h = (h ^ c) * 1099511628211ull;
  return h;
}

void check_same_config(const std::vector<std::string>& canonical_by_rank) {
  std::vector<int> odd;
  for (size_t r = 1; r < canonical_by_rank.size(); ++r)
    if (canonical_by_rank[r] != canonical_by_rank[0]) odd.push_back(static_cast<int>(r));
  if (odd.empty()) return;
  std::string ranks;
  for (size_t i = 0; i < odd.size() && i < 8; ++i) ranks += (i ? "," : "") + std::to_string(odd[i]);
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
  j["optim"] = {{"lr", optim.lr}, {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"eps", optim.eps},
                {"weight_decay", optim.weight_decay}, {"max_grad_norm", optim.max_grad_norm},
                {"warmup_steps", optim.warmup_steps}, {"total_steps", optim.total_steps},
                {"min_lr_frac", optim.min_lr_frac}};
  j["batch"] = global_batch;
  j["data_seed"] = data_seed;
  j["data"] = data;
  j["val_fraction"] = val_fraction;
  return j.dump();
}

std::string TrainConfig::to_json() const {
  nlohmann::json j = nlohmann::json::parse(workload_json());
  j["replicas"] = replicas;
  j["dp"] = dp;
  j["tp"] = tp;
  j["fsdp"] = fsdp;
  j["replica_reduce"] = replica_reduce;
  j["microbatches"] = microbatches;
  j["steps"] = steps;
  j["eval_every"] = eval_every;
  j["eval_batches"] = eval_batches;
  j["bucket_bytes"] = bucket_bytes;
  j["overlap"] = overlap;
  j["precision"] = precision;
  return j.dump();
}

}  // namespace pwm::model
