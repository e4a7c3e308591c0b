// The harness of dispatch_bench (the Pathways paper's dispatch experiments on MPI ranks): the
// flags, the rounds the controller and the workers go through, the timing helpers and the rows.
// Each figure's measurement and its summary live in a file of their own (figures.h); the report
// that prints and writes the rows is dispatch_report.h.
//
// World rank 0 is the controller (it runs the Pathways runtime), ranks 1..W the workers. Every
// T of Fig. 5/6 and then of Fig. 8 is a phase of rounds: the workers run the SPMD chain (the
// controller asleep) and a fresh runtime session measures the Pathways modes, in the order
// ABCD DCBA: the even rounds (the warm-up is round 0) SPMD first and the modes in their order,
// the odd ones the modes reversed and SPMD last (pathways_first). Then the controller's go
// message says whether another round at this T follows. SPMD and Pathways thus alternate within
// seconds, share whatever else the machine is doing, and neither always goes first. Fig. 7 runs
// in a last session.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/mpi_transport.h"
#include "pathways/runtime.h"

namespace pwm::pathways::bench {

// What a row measured: the `mode` column of the text and "mode" of the JSON (mode_name). Rows
// only ever compare these; the one place a mode becomes text is mode_name.
enum class Mode { kSpmd, kOpByOp, kChained, kFused, kParallel, kSequential, kClients, kStatic };
const char* mode_name(Mode m);

struct Row {
  int fig = 0;  // the paper's figure: 5 (T = 0), 6, 7 or 8
  Mode mode = Mode::kSpmd;
  int workers = 0, stages = 0;
  int64_t compute_us = 0;
  double per_s = 0;         // computations/s, best repetition
  int wrong = 0;
  double median_per_s = 0;  // median repetition
  int clients = 0;          // fig 8
  double busy = 0;          // fig 8: summed kernel time / (workers x wall), best repetition
  // Every timed round's rate, in round order (the JSON's round_computations_per_s). Fig. 5/6 and
  // Fig. 8: entry i of every row at one T (SPMD's included) is from round i, the SPMD chain and
  // the Pathways session run back to back, so a row pairs with its SPMD row by position. Fig. 7:
  // the repetitions of that row alone (parallel and sequential do not alternate).
  std::vector<double> round_per_s = {};
};

// The flags. A figure's list is parsed only when the figure runs (--figs).
struct BenchOptions {
  int chain = 128, reps = 7;
  std::vector<int64_t> ts;          // --compute-us: Fig. 5 (T = 0) and 6
  std::vector<int64_t> stages;      // --stages: Fig. 7
  int64_t stage_us = 0;             // --stage-us
  std::vector<int64_t> clients;     // --clients: Fig. 8
  std::vector<int64_t> fig8_ts;     // --fig8-us
  int fig8_reps = 5;
  double fig8_seconds = 0.25;
  std::string json_path, islands;
  // The lists as typed; check_options() parses them into the vectors above.
  std::string ts_s = "0,10,20,30,50,75,100,150,200,230,300,500,1000", stages_s = "1,2,4,8,16,32,64,128";
  std::string figs_s = "5,6,7,8", clients_s = "1,2,4,8,16", fig8_us_s = "40,330,1000,2400";

  // Fig. 8's SPMD chain at T: about as long as a client row (--fig8-seconds), at least --chain.
  int fig8_chain(int64_t t) const;
};

// Parses the flags (every rank). Returns the exit code when main should return at once (--help,
// a bad flag: rank 0 prints), else nothing.
std::optional<int> parse_options(int argc, char** argv, int rank, BenchOptions* o);

// Range-checks every number and list of `o` by flag name, parses the lists of the figures that
// run (--figs), checks --islands against the `workers`, and on rank 0 (`root`) that --json can be
// written. Throws pwm::Error with one line. Every rank, before any round.
void check_options(BenchOptions* o, int workers, bool root);

// What every phase needs. Made on every rank by start_bench.
struct Bench {
  BenchOptions opt;
  std::shared_ptr<collectives::Transport> transport;
  int workers = 0;            // W = world size - 1
  int result_tag = 0;         // worker rank 1 -> controller: an SPMD round; +1: the go message
  double iters_per_us = 0;    // controller: the workers' busy-loop speed, from their last round

  // A fresh runtime session's options: RuntimeOptions::from_env() with --islands.
  RuntimeOptions runtime_options() const;
};

// Checks the world size and the options and registers the benchmark kernels. Every rank; throws
// on a world of one rank or a non-positive --chain or --reps.
Bench start_bench(collectives::MpiEnvironment& env, BenchOptions opt);

// Ranks 1..W: every round of every phase, then the Fig. 7 session. Returns when the controller
// has ended the last one.
void run_workers(const Bench& b);

// Round `round` of a phase (0: the warm-up) runs the Pathways session before the SPMD chain, its
// modes in reverse order (both sides of every round ask this).
bool pathways_first(int round);

// Controller side of a round. The workers' SPMD chain of this round: seconds (the slowest
// worker) and 1 if its result was wrong. Waits asleep; records b->iters_per_us.
struct SpmdRound {
  double seconds = 0;
  int wrong = 0;
  // The chained program run by the workers alone (the static model, static_mpmd/executor.h):
  // Fig. 5/6's phases only (negative: not run).
  double static_seconds = -1;
  int static_wrong = 0;
};
SpmdRound await_spmd_round(Bench* b);
// Ends a round (after the runtime's shutdown): tells the workers whether another follows.
void send_go(const Bench& b, bool more);

// 0 if the scalar `a` holds `want`, else 1 (every run's result is checked: a chain of k
// computations from 0 ends at k).
int count_wrong(const Array& a, float want);

// The machine may be shared: interference only slows a run down, so rows report the best of
// the repetitions (the fastest time); the median is kept in the JSON as well.
double best(const std::vector<double>& v);  // smallest; 0 if empty
double median(std::vector<double> v);       // upper median; 0 if empty
// `n` computations over each of `seconds`: the rate of every round, in the same order.
std::vector<double> round_rates(double n, const std::vector<double>& seconds);
double cpu_seconds();                       // this process, all threads

}  // namespace pwm::pathways::bench
