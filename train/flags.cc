#include "train/flags.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <vector>

#include "common/check.h"
#include "common/cli.h"
#include "common/env.h"
#include "common/paths.h"
#include "model/config_fields.h"

namespace pwm::train {

namespace {

// An enum flag: CLI11 checks the text against `names` (its usual one-line error), then `set`
// parses it (train/modes.h). `shown` is the default --help prints.
template <typename Set>
CLI::Option* add_mode(CLI::App& app, const std::string& flag, Set set, const std::vector<std::string>& names,
                      const std::string& help, const std::string& shown) {
  return app.add_option_function<std::string>(flag, set, help)->check(CLI::IsMember(names))->default_str(shown);
}

void add_mpmd_flags(CLI::App& app, MpmdConfig& p, FlagSet set) {
  const char* P = "Pathways";
  add_mode(app, "--granularity", [&p](const std::string& s) { p.granularity = parse_granularity(s); },
           granularity_names(), "fused | chained | opbyop", name(p.granularity))->group(P);
  app.add_option("--stages", p.stages, "pipeline stages (> 1: MPMD pipeline, each stage a --dp x --tp slice)")->group(P);
  add_mode(app, "--schedule", [&p](const std::string& s) { p.schedule = parse_schedule(s); }, schedule_names(),
           "pipeline schedule: gpipe | 1f1b", name(p.schedule))->group(P);
  add_mode(app, "--moe-routing", [&p](const std::string& s) { p.moe_routing = parse_moe_routing(s); },
           moe_routing_names(),
           "MoE expert calls: static (capacity) | controller (dropless, a round trip per MoE layer) | worker "
           "(dropless, counts among the workers) | auto",
           name(p.moe_routing))->group(P);
  if (set == FlagSet::kStatic) {
    app.add_option("--quota", p.quota,
                   "pipeline: activations a stage may hold (its registers; 0: what --schedule needs); a quota below "
                   "the schedule's need is refused before training")
        ->group(P);
    return;
  }
  app.add_option("--islands", p.islands, "islands: KxM (K islands of M devices); default: one per host")->group(P);
  app.add_flag("--sequential", p.sequential, "sequential dispatch (the paper's baseline)")->group(P);
  app.add_flag("--expert-island", p.expert_island,
               "MoE: the experts on an island of their own (--expert-parallel more workers), the rows sent there "
               "and back as transfers")
      ->group(P);
  app.add_option("--spare-workers", p.spare_workers,
                 "workers beyond the slices: a lost worker's slice moves onto one and the run goes on (dense, no "
                 "--fsdp; OpenMPI's mpirun --enable-recovery)")
      ->group(P);
}

}  // namespace

void add_train_flags(CLI::App& app, TrainConfig& c, FlagSet set) {
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // The model's fields, from their one table (model/config_fields.h).
  for (const model::ConfigField& f : model::config_fields()) {
    const char* group = f.group == model::ConfigField::Group::kModel ? "Model" : "Mixture of Experts";
    std::visit(
        [&](auto m) {
          if constexpr (std::is_same_v<decltype(m), model::NormKind model::Config::*>)
            app.add_option_function<std::string>(
                   f.flag, [&c, m](const std::string& s) { c.model.*m = model::parse_norm(s); }, f.help)
                ->group(group);
          else
            app.add_option(f.flag, c.model.*m, f.help)->group(group);
        },
        f.member);
  }

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
  app.add_option("--replicas", c.mesh.replicas, "model replicas, one per island (data parallel across islands)")->group(W);
  app.add_option("--dp", c.mesh.dp, "data-parallel ranks inside a replica")->group(W);
  app.add_option("--tp", c.mesh.tp, "tensor-parallel ranks (adjacent world ranks)")->group(W);
  app.add_option("--expert-parallel", c.mesh.ep,
                 "split each MoE layer's experts over this many consecutive --dp ranks (AllToAll dispatch)")
      ->group(W);
  app.add_flag("--fsdp,!--no-fsdp", c.mesh.fsdp, "shard parameters, gradients and AdamW moments over --dp (ZeRO-3)")->group(W);
  if (set == FlagSet::kSpmd)
    add_mode(app, "--replica-reduce", [&c](const std::string& s) { c.exec.replica_reduce = parse_replica_reduce(s); },
             replica_reduce_names(),
             "spmd_train with --replicas > 1: hierarchical (reduce-scatter, cross-replica allreduce, allgather) or flat",
             name(c.exec.replica_reduce))
        ->group(W);
  app.add_option("--batch", c.workload.global_batch, "global batch in sequences per optimizer step")->group(W);
  app.add_option("--microbatches", c.workload.microbatches, "gradient-accumulation micro-batches per dp rank")->group(W);
  app.add_option("--steps", c.workload.steps, "optimizer steps (also the cosine schedule's length)")->group(W);
  app.add_option("--data-seed", c.workload.data_seed, "seed of the batch sampler")->group(W);
  app.add_option("--data", c.workload.data, "text file or directory (default: /usr/share/common-licenses)")->group(W);
  app.add_option("--val-fraction", c.workload.val_fraction, "share of the data held out for validation")->group(W);
  app.add_option("--eval-every", c.workload.eval_every, "validation loss every N steps (0: at the end only)")->group(W);
  app.add_option("--eval-batches", c.workload.eval_batches, "validation batches per evaluation")->group(W);
  app.add_option("--skip-nonfinite", c.workload.skip_nonfinite,
                 "skip up to N steps whose loss or gradient norm is non-finite (no update); the next ends the run")
      ->group(W);

  const char* U = "Outputs";
  app.add_option("--log-every", c.outputs.log_every, "progress line every N steps (rank 0)")->group(U);
  app.add_option("--metrics", c.outputs.metrics, "JSON-lines metrics file")->group(U);
  app.add_option("--trace", c.outputs.trace, "Chrome/Perfetto trace file merged from all ranks")->group(U);
  app.add_option("--ckpt", c.outputs.ckpt, "checkpoint file (written every --ckpt-every steps and at the end)")->group(U);
  app.add_option("--ckpt-every", c.outputs.ckpt_every, "checkpoint every N steps (0: at the end only)")->group(U);
  app.add_flag("--resume", c.outputs.resume, "resume from --ckpt when it exists")->group(U);

  const char* E = "Execution";
  app.add_option("--bucket-bytes", c.exec.bucket_bytes, "gradient AllReduce bucket (fusion buffer) size in bytes (0: sized from the model)")->group(E);
  app.add_flag("--overlap,!--no-overlap", c.exec.overlap, "overlap bucket AllReduces with backward")->group(E);
  app.add_option("--coll-timeout", c.exec.coll_timeout, "collectives watchdog and liveness timeout, seconds (default: PWM_COLL_TIMEOUT, else 300)")->group(E);
  app.add_option("--peak-gflops", c.exec.peak_gflops, "per-rank GEMM peak for MFU (0: measure)")->group(E);
  add_mode(app, "--precision", [&c](const std::string& s) { c.exec.precision = model::parse_precision(s); },
           {"fp32", "bf16"}, "matrix products: fp32, or bf16 with fp32 sums (oneDNN)",
           model::precision_name(c.exec.precision))
      ->group(E);

  const char* T = "Testing";
  app.add_option("--kill-step", c.hooks.kill_step, "--kill-signal --kill-rank in the middle of this step")->group(T);
  app.add_option("--kill-rank", c.hooks.kill_rank)->group(T);
  add_mode(app, "--kill-signal",
           [&c](const std::string& s) {
             c.hooks.kill_signal = s == "stop" ? TestHooks::KillSignal::kStop : TestHooks::KillSignal::kKill;
           },
           {"kill", "stop"}, "what --kill-step does to --kill-rank: kill (SIGKILL) or stop (SIGSTOP)", "kill")
      ->group(T);
  app.add_option("--step-sleep-ms", c.hooks.step_sleep_ms, "sleep after every step (kill tests)")->group(T);
  app.add_option("--nan-step", c.hooks.nan_step, "make this step's loss and gradient norm NaN (non-finite tests)")->group(T);
  app.add_option("--straggler-ms", c.hooks.straggler_ms, "--straggler-rank spends this much more in every step, ms")->group(T);
  app.add_option("--straggler-rank", c.hooks.straggler_rank, "the world rank --straggler-ms slows")->group(T);
  if (is_mpmd(set)) add_mpmd_flags(app, c.mpmd, set);
}

bool is_mpmd(FlagSet set) { return set != FlagSet::kSpmd; }

namespace {

const char* trainer_of(FlagSet s) {
  switch (s) {
    case FlagSet::kSpmd: return "spmd_train";
    case FlagSet::kPathways: return "pathways_train";
    case FlagSet::kStatic: return "mpmd_train";
  }
  return "?";
}

// The trainers other than `set`'s that have `flag` ("--islands"), in words ("pathways_train's");
// "" when none has it.
std::string owners(const std::string& flag, FlagSet set) {
  std::string who;
  for (FlagSet s : {FlagSet::kSpmd, FlagSet::kPathways, FlagSet::kStatic}) {
    if (s == set) continue;
    CLI::App other;
    TrainConfig c;
    add_train_flags(other, c, s);
    if (other.get_option_no_throw(flag) == nullptr) continue;
    who += fmt::format("{}{}'s", who.empty() ? "" : " and ", trainer_of(s));
  }
  return who;
}

// A flag this trainer does not have but another one does: refused naming its owner (CLI11's own
// line would only say it is not a flag of this one).
void refuse_foreign_flags(const CLI::App& app, int argc, char** argv, FlagSet set, const std::string& program) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) continue;
    const std::string flag = a.substr(0, a.find('='));
    if (app.get_option_no_throw(flag) != nullptr) continue;
    const std::string who = owners(flag, set);
    if (!who.empty())
      PWM_THROW("{} is {}, not a flag of {}: leave it out (see {} --help)", flag, who, program, program);
  }
}

// Flags a config file cannot set: the file itself and --help.
bool reserved_key(const std::string& key) { return key == "config" || key == "help" || key == "h"; }

// JSON config -> "--key=value" arguments, so that the file and the flags share one parser. Every
// key must be a flag of `app` (the trainer's own set), named without its dashes.
std::vector<std::string> json_to_args(std::string_view text, const std::string& path, const CLI::App& app,
                                      FlagSet set, const std::string& program) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const std::string where = e.byte >= text.size() ? "it ends early" : fmt::format("at byte {}", e.byte);
    PWM_THROW("--config {} is not valid JSON ({}): it must hold one object such as {{\"lr\": 3e-4, \"steps\": 100}}",
              path, where);
  } catch (const std::exception&) {
    PWM_THROW("--config {} is not valid JSON: it must hold one object such as {{\"lr\": 3e-4, \"steps\": 100}}", path);
  }
  if (!j.is_object()) PWM_THROW("--config {} must hold one JSON object of flag names to values", path);
  std::vector<std::string> args;
  for (auto& [key, v] : j.items()) {
    if (reserved_key(key)) PWM_THROW("--config {}: key '{}' cannot be set from a config file", path, key);
    if (app.get_option_no_throw("--" + key) == nullptr && !owners("--" + key, set).empty())
      PWM_THROW("--config {}: key '{}' is {}, not a flag of {}: leave it out", path, key, owners("--" + key, set), program);
    if (app.get_option_no_throw("--" + key) == nullptr)
      PWM_THROW("--config {}: key '{}' is not a flag of {} (keys are flag names without the dashes, e.g. "
                "\"seq-len\"; see {} --help)",
                path, key, program, program);
    std::string val;
    if (v.is_string()) val = v.get<std::string>();
    else if (v.is_boolean()) val = v.get<bool>() ? "true" : "false";
    else if (v.is_number()) val = v.dump();
    else PWM_THROW("--config {}: key '{}' must be a string, number or boolean", path, key);
    args.push_back("--" + key + "=" + val);
  }
  return args;
}

// A config file is read whole on every rank: a regular file of at most this size, checked before
// it is opened (a FIFO would block the rank in open(2) while the others have refused it).
constexpr uintmax_t kMaxConfigBytes = 1 << 20;

std::string read_config_file(const std::string& path) {
  check_input_file("--config", path, kMaxConfigBytes);
  std::ifstream in(path);
  if (!in) PWM_THROW("cannot read --config {}: check the path", path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) PWM_THROW("cannot read --config {}: check the path", path);
  return text;
}

}  // namespace

void load_train_config_file(const std::string& path, TrainConfig& cfg, FlagSet set, const std::string& program) {
  parse_train_config_text(read_config_file(path), path, cfg, set, program);
}

void parse_train_config_text(std::string_view text, const std::string& path, TrainConfig& cfg, FlagSet set,
                             const std::string& program) {
  CLI::App app{"", program};
  add_train_flags(app, cfg, set);
  auto args = json_to_args(text, path, app, set, program);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  parse_arguments(app, std::move(args), "--config " + path);
}

bool parse_train_config(int argc, char** argv, const std::string& program, const std::string& description,
                        TrainConfig& cfg, int& exit_code, bool print_help,
                        const std::function<void(CLI::App&)>& more_flags, FlagSet set) {
  // The environment's settings are the defaults, a config file overrides them, and flags on
  // the command line override both. This is the one place a trainer resolves them.
  cfg.exec.coll_timeout = env_double("PWM_COLL_TIMEOUT", cfg.exec.coll_timeout);
  // --config first, so that flags on the command line override the file.
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) cfg.config_file = argv[i + 1];
    else if (a.rfind("--config=", 0) == 0) cfg.config_file = a.substr(9);
    else continue;
    load_train_config_file(cfg.config_file, cfg, set, program);
  }
  CLI::App app{description, program};
  std::string config_path;
  app.add_option("--config", config_path, "JSON file of flag values (flags override it)");
  add_train_flags(app, cfg, set);
  if (more_flags) more_flags(app);
  refuse_foreign_flags(app, argc, argv, set, program);
  if (!parse_command_line(app, argc, argv, program, print_help, exit_code)) return false;
  cfg.optim.total_steps = cfg.workload.steps;
  return true;
}

}  // namespace pwm::train
