#include "train/bootstrap.h"

#include <fmt/format.h>

#include <algorithm>

#include "collectives/strings.h"
#include "common/check.h"
#include "model/kernels.h"
#include "train/checks.h"
#include "train/flag_use.h"

namespace pwm::train {

namespace {

// Flags and --config; false (exit_code set) after --help. A flag the configuration does not use
// is refused here, before any check that needs the job (train/flag_use.h).
bool parse(int argc, char** argv, int rank, const TrainerSpec& spec, TrainConfig& cfg, int& exit_code) {
  if (!parse_train_config(argc, argv, spec.program, spec.description, cfg, exit_code, rank == 0, {}, spec.flags))
    return false;
  refuse_unused_flags(cfg);
  return true;
}

// Everything that can be checked before training without opening a file, on every rank: the
// configuration, every path (common/paths.h), the memory this host's ranks need. Rank 0 also
// probes that each output can be created.
void check_inputs(collectives::MpiEnvironment& env, const TrainerSpec& spec, TrainConfig& cfg,
                  const std::vector<std::string>& hosts) {
  spec.validate(cfg, env.size());
  cfg.validate_kill_rank(env.size());
  apply_precision(cfg);
  const std::vector<NamedPath> outputs = output_paths(cfg, spec.more_outputs ? spec.more_outputs() : std::vector<NamedPath>{});
  const double data_bytes = static_cast<double>(check_paths(cfg, outputs));
  const bool compute = !(spec.controller && env.rank() == 0);
  if (compute) {
    const std::string& me = hosts[static_cast<size_t>(env.rank())];
    const int first = spec.controller ? 1 : 0;  // the controller holds no tensors
    const int here = static_cast<int>(std::count(hosts.begin() + first, hosts.end(), me));
    const int processes = static_cast<int>(std::count(hosts.begin(), hosts.end(), me));  // each holds the data
    check_memory(cfg, here, data_bytes * processes, is_mpmd(spec.flags));
  }
  if (env.rank() == 0) check_output_paths(outputs);
}

// What the run reads, once every rank has accepted every path.
void open_inputs(Startup& s) {
  s.data = open_training_data(s.cfg);
  s.resume_from = load_resume_checkpoint(s.cfg);
}

}  // namespace

std::optional<int> bootstrap(int argc, char** argv, collectives::MpiEnvironment& env, const TrainerSpec& spec,
                             Startup& out) {
  collectives::Communicator world = collectives::Communicator::world(env.transport());
  int exit_code = 0;
  bool go = true;
  if (!collectives::agree_on_errors(world, spec.program, [&] { go = parse(argc, argv, env.rank(), spec, out.cfg, exit_code); }))
    return kExitRefused;
  if (!go) return exit_code;
  // The start-up's later agreements wait as long as the run's collectives (--coll-timeout): a
  // rank lost now ends the job as it would later. (The flags' own agreement above has only
  // PWM_COLL_TIMEOUT, or 300 s.)
  world.options().timeout_s = out.cfg.exec.coll_timeout;
  out.hosts = collectives::allgather_strings(world, env.processor_name());
  // Every rank must run the same configuration: ranks of an MPMD launch (`mpirun -n 1 spmd_train
  // --seed 1 : -n 1 spmd_train --seed 2`) would otherwise train apart silently, post collectives
  // of other sizes, or dispatch programs the workers shape differently. One 8-byte AllGather of
  // a hash; the texts are exchanged only to name the difference.
  const bool mpmd = is_mpmd(spec.flags);
  if (!collectives::agree_on_errors(world, spec.program, [&] {
        check_same_config(collectives::gather_if_different(world, out.cfg.canonical_json(mpmd)));
      }))
    return kExitRefused;
  if (!collectives::agree_on_errors(world, spec.program, [&] { check_inputs(env, spec, out.cfg, out.hosts); }))
    return kExitRefused;
  if (!collectives::agree_on_errors(world, spec.program, [&] { open_inputs(out); })) return kExitRefused;
  return std::nullopt;
}

namespace {
// The mean of every rank's probe rate (every rank probes at once, as it runs).
double mean_rate(collectives::Communicator& world, double rate) {
  world.allreduce(&rate, &rate, 1, collectives::DataType::kFloat64, collectives::ReduceOp::kSum);
  return rate / world.size();
}
}  // namespace

Peak gemm_peak(collectives::Communicator& world, const TrainConfig& cfg, model::GemmProbe* probe) {
  if (cfg.exec.peak_gflops > 0) return Peak::given(cfg.exec.peak_gflops);
  PWM_CHECK(probe != nullptr, "a rank without its GEMM probe");
  return Peak::probed(mean_rate(world, startup_probe(*probe)));
}

double probe_gemm_peak(collectives::Communicator& world, model::GemmProbe& probe, double budget_s) {
  return mean_rate(world, probe.run(budget_s));
}

void print_header(const std::string& tag, const std::string& who, const TrainConfig& cfg, const std::string& where,
                  const Peak& peak, const std::string& unit) {
  fmt::print("[{}] {} | {} | batch {} x {} tokens, {} micro-batches | {}GEMM peak {:.1f} GFLOP/s per {} ({})\n", tag,
             who, cfg.model.to_string(), cfg.workload.global_batch, cfg.model.seq_len, cfg.workload.microbatches, where,
             peak.gflops(), unit, peak.source());
  if (cfg.exec.precision != model::Precision::kFp32)
    fmt::print("[{}] precision {}: {}\n", tag, model::precision_name(cfg.exec.precision), model::bf16_info());
}

}  // namespace pwm::train
