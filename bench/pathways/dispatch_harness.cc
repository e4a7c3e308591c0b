#include "bench/pathways/dispatch_harness.h"

#include <cstdio>
#include <CLI/CLI.hpp>

#include <sys/resource.h>

#include <algorithm>

#include "bench/pathways/bench_kernels.h"
#include "dataflow/buffer.h"
#include "dataflow/builder.h"
#include "static_mpmd/executor.h"
#include "common/check.h"
#include "common/parse.h"
#include "common/atomic_file.h"
#include "common/cli.h"
#include "common/time.h"
#include "pathways/backoff.h"
#include "pathways/resource_manager.h"
#include "pathways/tags.h"
#include "pathways/worker.h"

namespace pwm::pathways::bench {

namespace {

// A comma-separated list of whole numbers in [lo, hi], at least one, for `flag`.
std::vector<int64_t> parse_list(const char* flag, const std::string& s, int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(parse_whole(fmt::format("{} {} (comma-separated whole numbers in [{}, {}])", flag, s, lo, hi),
                            s.substr(p, q - p), lo, hi));
    p = q + 1;
  }
  return v;
}

// One SPMD chain on the worker ranks: seconds (slowest worker); counts a wrong result.
double spmd_chain(collectives::Communicator& wc, int chain, int64_t t, double* wrong) {
  wc.barrier();
  const double t0 = now_s();
  float x = 0;
  for (int i = 0; i < chain; ++i) step(wc, x, t);
  double dt = now_s() - t0;
  wc.allreduce(&dt, &dt, 1, collectives::DataType::kFloat64, collectives::ReduceOp::kMax);
  if (x != static_cast<float>(chain)) *wrong += 1;
  return dt;
}

// The static model's chain (issue 37): the chained program of `chain` bench_step nodes over the
// workers, lowered by every worker with the same mapping and run by each from its own list, no
// controller (static_mpmd/executor.h). Lowered and run once outside the timing; the timed run is
// the slowest worker's. Its tags are on channels 51 and 52 (tags.h leaves them to code around
// the runtime), its slice communicator context 901.
double static_chain(const Bench& b, const std::vector<int>& ranks, int chain, int64_t t, double* wrong) {
  const int n = static_cast<int>(ranks.size());
  dataflow::Builder cb(fmt::format("static_chain_T{}", t));
  dataflow::Value v = cb.param(0, n, dataflow::ArgSpec{dataflow::TensorSpec{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated});
  for (int i = 0; i < chain; ++i) v = cb.call("bench_step", 0, n, {v}, {t})[0];
  cb.output(v);
  const auto lookup = [&](int) { return dataflow::SliceMapping{ranks, tags::kUserContextBase + 1, 0, 0}; };
  const dataflow::LoweredProgram lp = dataflow::lower(cb.build(), 0, lookup);
  const dataflow::Plan mine(lp.workers.at(b.transport->rank()));
  static_mpmd::Executor exec(b.transport, collectives::CommOptions::from_env().timeout_s, tags::kUserChannel + 1);
  auto x0 = std::make_shared<dataflow::Object>(dataflow::TensorSpec{collectives::DataType::kFloat32, {1}});
  *static_cast<float*>(x0->buf.data()) = 0;
  collectives::Communicator wc(b.transport, ranks, tags::kUserContextBase + 2);
  double dt = 0;
  for (int rep = 0; rep < 2; ++rep) {  // (the first run allocates the slots and the slice's communicator)
    wc.barrier();
    const double t0 = now_s();
    const static_mpmd::Shards out = exec.run(mine, {{0, x0}});
    dt = now_s() - t0;
    if (*static_cast<const float*>(out.at(0)->buf.data()) != static_cast<float>(chain)) *wrong += 1;
  }
  wc.allreduce(&dt, &dt, 1, collectives::DataType::kFloat64, collectives::ReduceOp::kMax);
  return dt;
}

// Waits for a point-to-point message without spinning (the controller during the SPMD phase,
// worker rank 1 for the go message).
void recv_asleep(collectives::Transport& t, void* buf, size_t bytes, int peer, int tag) {
  collectives::Request r = t.irecv(buf, bytes, peer, tag);
  Backoff b(10, 1000);
  while (!t.test(r, nullptr)) b.idle();
}

void send_spinning(collectives::Transport& t, const void* buf, size_t bytes, int peer, int tag) {
  collectives::Request q = t.isend(buf, bytes, peer, tag);
  while (!t.test(q, nullptr)) {
  }
}

}  // namespace

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kSpmd: return "spmd";
    case Mode::kOpByOp: return "opbyop";
    case Mode::kChained: return "chained";
    case Mode::kFused: return "fused";
    case Mode::kParallel: return "parallel";
    case Mode::kSequential: return "sequential";
    case Mode::kClients: return "clients";
    case Mode::kStatic: return "static";
  }
  return "?";
}

// Fig. 8's SPMD chain lasts about as long as a client row (--fig8-seconds): the best of several
// short windows would be biased upwards against the best of the longer client rows.
int BenchOptions::fig8_chain(int64_t t) const {
  return std::max<int>(chain, static_cast<int>(fig8_seconds / (1e-6 * static_cast<double>(std::max<int64_t>(t, 1)))));
}

std::optional<int> parse_options(int argc, char** argv, int rank, BenchOptions* o) {
  CLI::App app{"dispatch_bench: Pathways dispatch overhead against SPMD (paper Fig. 5-7)"};
  app.add_option("--chain", o->chain, "computations per chain (Fig. 5/6)");
  app.add_option("--compute-us", o->ts_s, "comma-separated compute times T per computation (us)");
  app.add_option("--reps", o->reps, "timed repetitions per row (the best is reported)");
  app.add_option("--stages", o->stages_s, "comma-separated pipeline lengths (Fig. 7)");
  app.add_option("--stage-us", o->stage_us, "compute per pipeline stage (us)");
  app.add_option("--json", o->json_path, "also write the rows as JSON to this file");
  app.add_option("--islands", o->islands,
                 "the runtime's islands: KxM (e.g. 1x4: one island over the workers of several hosts, as a "
                 "TPU pod spans its hosts); default one island per host");
  app.add_option("--figs", o->figs_s, "which figures to run (5,6: the --compute-us sweep; 7; 8)");
  app.add_option("--clients", o->clients_s, "Fig. 8: comma-separated numbers of concurrent clients");
  app.add_option("--fig8-us", o->fig8_us_s, "Fig. 8: comma-separated compute times per program (us)");
  app.add_option("--fig8-reps", o->fig8_reps, "Fig. 8: rounds per T (the best is reported)");
  app.add_option("--fig8-seconds", o->fig8_seconds, "Fig. 8: approximate length of one row's measurement");
  try {  // every rank parses the same argv and reaches the same verdict; rank 0 says it
    if (int code = 0; !pwm::parse_command_line(app, argc, argv, "dispatch_bench", rank == 0, code)) return code;
  } catch (const Error& e) {
    if (rank == 0) std::fprintf(stderr, "dispatch_bench: error: %s\n", e.what());
    return 1;
  }
  return std::nullopt;
}

void check_options(BenchOptions* o, int workers, bool root) {
  if (workers < 1) PWM_THROW("dispatch_bench needs at least 2 ranks (a controller and a worker)");
  auto in = [](const char* flag, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) PWM_THROW("{} must be in [{}, {}] (got {})", flag, lo, hi, v);
  };
  in("--chain", o->chain, 1, 1 << 20);
  in("--reps", o->reps, 1, 10000);
  in("--fig8-reps", o->fig8_reps, 1, 10000);
  in("--stage-us", static_cast<double>(o->stage_us), 0, 1e7);
  if (!(o->fig8_seconds > 0 && o->fig8_seconds <= 3600))
    PWM_THROW("--fig8-seconds must be > 0 and at most 3600 (got {})", o->fig8_seconds);
  const std::vector<int64_t> figs = parse_list("--figs", o->figs_s, 5, 8);
  auto fig_on = [&](int f) { return std::find(figs.begin(), figs.end(), f) != figs.end(); };
  o->ts.clear();
  o->stages.clear();
  o->fig8_ts.clear();
  if (fig_on(5) || fig_on(6)) o->ts = parse_list("--compute-us", o->ts_s, 0, 10000000);
  if (fig_on(7)) o->stages = parse_list("--stages", o->stages_s, 1, 100000);
  o->clients = parse_list("--clients", o->clients_s, 1, 256);
  if (fig_on(8)) o->fig8_ts = parse_list("--fig8-us", o->fig8_us_s, 0, 10000000);
  if (!o->islands.empty()) {
    const auto [k, m] = ResourceManager::parse_islands(o->islands);
    if (static_cast<int64_t>(k) * m != workers)
      PWM_THROW("--islands {}: {} x {} = {} devices but there are {} workers; run with {} ranks", o->islands, k, m,
                static_cast<int64_t>(k) * m, workers, static_cast<int64_t>(k) * m + 1);
  }
  if (root && !o->json_path.empty()) check_output_path("--json", o->json_path);
}

RuntimeOptions Bench::runtime_options() const {
  RuntimeOptions o = RuntimeOptions::from_env();
  o.islands = opt.islands;
  return o;
}

Bench start_bench(collectives::MpiEnvironment& env, BenchOptions opt) {
  Bench b;
  b.workers = env.size() - 1;
  if (b.workers < 1) PWM_THROW("dispatch_bench needs at least 2 ranks (a controller and a worker)");
  if (opt.chain < 1 || opt.reps < 1 || opt.fig8_reps < 1) PWM_THROW("--chain, --reps and --fig8-reps must be >= 1");
  b.opt = std::move(opt);
  register_bench_kernels();
  b.transport = env.transport();
  b.result_tag = tags::user_tag(1);
  return b;
}

// A phase per T (Fig. 5/6's, then Fig. 8's with its longer chain), each a series of rounds: the
// SPMD chain and a runtime session, in the order pathways_first() gives. Worker rank 1 reports
// the chain to the controller and passes its go message on to the other workers.
void run_workers(const Bench& b) {
  calibrate();
  const int rank = b.transport->rank();
  std::vector<int> ranks;
  for (int r = 1; r <= b.workers; ++r) ranks.push_back(r);
  collectives::Communicator wc(b.transport, ranks, tags::kUserContextBase);
  std::vector<int64_t> phases = b.opt.ts;
  phases.insert(phases.end(), b.opt.fig8_ts.begin(), b.opt.fig8_ts.end());
  for (size_t ph = 0; ph < phases.size(); ++ph) {
    const int64_t t = phases[ph];
    const int n = ph < b.opt.ts.size() ? b.opt.chain : b.opt.fig8_chain(t);
    for (double more = 1, round = 0; more != 0; ++round) {
      const auto spmd = [&] {
        double msg[5] = {0, 0, iters_per_us(), -1, 0};
        msg[0] = spmd_chain(wc, n, t, &msg[1]);
        if (ph < b.opt.ts.size()) msg[3] = static_chain(b, ranks, n, t, &msg[4]);
        if (rank == 1) send_spinning(*b.transport, msg, sizeof(msg), 0, b.result_tag);
      };
      if (!pathways_first(static_cast<int>(round))) spmd();
      run_worker(b.transport);
      if (pathways_first(static_cast<int>(round))) spmd();
      if (rank == 1) recv_asleep(*b.transport, &more, sizeof(more), 0, b.result_tag + 1);
      wc.broadcast(&more, 1, collectives::DataType::kFloat64, 0);
    }
  }
  if (!b.opt.stages.empty()) run_worker(b.transport);  // the Fig. 7 session
}

bool pathways_first(int round) { return round % 2 == 1; }

SpmdRound await_spmd_round(Bench* b) {
  double msg[5];
  recv_asleep(*b->transport, msg, sizeof(msg), 1, b->result_tag);
  b->iters_per_us = msg[2];
  return {msg[0], static_cast<int>(msg[1]), msg[3], static_cast<int>(msg[4])};
}

void send_go(const Bench& b, bool more) {
  double go = more ? 1 : 0;
  send_spinning(*b.transport, &go, sizeof(go), 1, b.result_tag + 1);
}

int count_wrong(const Array& a, float want) {
  float got = a.get<float>()[0];
  return got == want ? 0 : 1;
}

double best(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<double> round_rates(double n, const std::vector<double>& seconds) {
  std::vector<double> v;
  v.reserve(seconds.size());
  for (double s : seconds) v.push_back(n / s);
  return v;
}

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace pwm::pathways::bench
