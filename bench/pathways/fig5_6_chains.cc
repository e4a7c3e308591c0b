// Fig. 5/6: a chain of --chain computations (T us of busy compute, a scalar AllReduce over the
// workers, an add) run five ways in one job:
//   spmd     every worker runs the chain itself on a communicator of the worker ranks; the
//            controller only waits, asleep (the multi-controller baseline);
//   opbyop   one Pathways program per computation (Client::call), each taking the previous
//            output future as input;
//   chained  one traced program of --chain nodes, dispatched at once;
//   fused    one kernel running the whole chain, dispatched once;
//   static   the chained program with no controller: every worker lowers it and runs its own
//            instruction list (static_mpmd/executor.h), timed in the SPMD phase.
// Throughput = computations per second, best of --reps (the JSON has the median too). For opbyop
// and chained the break-even is the smallest swept T from which on Pathways reaches 95% of SPMD.
#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <utility>

#include "bench/pathways/dispatch_report.h"
#include "bench/pathways/figures.h"
#include "common/time.h"

namespace pwm::pathways::bench {

namespace {

// One T's measurements so far: seconds per timed chain, and wrong results, by mode.
struct Samples {
  std::map<Mode, std::vector<double>> times;
  std::map<Mode, int> wrong;
};

// OpByOp: one program per computation. Its one program is lowered and cached by a first call
// outside the timing, as chained and fused are run once before theirs (a lowering is not a
// dispatch cost, and the timed chain of OpByOp alone used to include one).
void time_opbyop(Client& c, const Slice& s, const Array& x0, int chain, int64_t t, bool timed, Samples* out) {
  out->wrong[Mode::kOpByOp] += count_wrong(c.call("bench_step", s, {x0}, {t})[0], 1.0f);
  Array x = x0;
  const double t0 = now_s();
  for (int i = 0; i < chain; ++i) x = c.call("bench_step", s, {x}, {t})[0];
  x.wait();
  if (timed) out->times[Mode::kOpByOp].push_back(now_s() - t0);
  out->wrong[Mode::kOpByOp] += count_wrong(x, static_cast<float>(chain));
}

// A cached program: lowered and loaded by a first run, then timed.
void time_program(Client& c, const Program& p, Mode mode, const Array& x0, int chain, bool timed, Samples* out) {
  out->wrong[mode] += count_wrong(c.run(p, {x0})[0], static_cast<float>(chain));
  const double t0 = now_s();
  Array y = c.run(p, {x0})[0];
  y.wait();
  if (timed) out->times[mode].push_back(now_s() - t0);
  out->wrong[mode] += count_wrong(y, static_cast<float>(chain));
}

// One round's runtime session: the three Pathways modes at T (`reverse`: fused, chained, opbyop),
// then the runtime's shutdown (before the session's handles go).
void time_pathways(const Bench& b, Runtime& rt, int64_t t, bool timed, bool reverse, Samples* out) {
  const int chain = b.opt.chain;
  Client c = rt.client("dispatch_bench");
  Slice s = c.allocate(b.workers);
  Array x0 = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0});
  if (!reverse) time_opbyop(c, s, x0, chain, t, timed, out);
  ProgramBuilder cb(fmt::format("chain_T{}", t));
  Value v = cb.param_like(x0);
  for (int i = 0; i < chain; ++i) v = cb.call("bench_step", s, {v}, {t})[0];
  cb.output(v);
  const Program chained = cb.build();
  ProgramBuilder fb(fmt::format("fused_T{}", t));
  fb.output(fb.call("bench_fused", s, {fb.param_like(x0)}, {chain, t})[0]);
  const Program fused = fb.build();
  if (reverse) {
    time_program(c, fused, Mode::kFused, x0, chain, timed, out);
    time_program(c, chained, Mode::kChained, x0, chain, timed, out);
    time_opbyop(c, s, x0, chain, t, timed, out);
  } else {
    time_program(c, chained, Mode::kChained, x0, chain, timed, out);
    time_program(c, fused, Mode::kFused, x0, chain, timed, out);
  }
  rt.shutdown();
}

// Rounds: a warm-up, `reps` timed ones, and up to 2 * reps more when OpByOp or Chained is under
// 95% of SPMD after them (more samples where the machine was noisy; every mode, SPMD included,
// gets them, and each row reports its best). Appends T's rows to `rows`.
void run_one_t(Bench* b, int64_t t, std::vector<Row>* rows) {
  const int chain = b->opt.chain, reps = b->opt.reps;
  Samples out;
  auto below = [&] {
    for (Mode m : {Mode::kOpByOp, Mode::kChained})
      if (chain / best(out.times[m]) < 0.95 * chain / best(out.times[Mode::kSpmd])) return true;
    return false;
  };
  for (int r = -1;; ++r) {
    const bool pw_first = pathways_first(r + 1);
    const auto spmd = [&] {
      const SpmdRound sr = await_spmd_round(b);
      out.wrong[Mode::kSpmd] += sr.wrong;
      out.wrong[Mode::kStatic] += sr.static_wrong;
      if (r >= 0) out.times[Mode::kSpmd].push_back(sr.seconds);
      if (r >= 0) out.times[Mode::kStatic].push_back(sr.static_seconds);
    };
    if (!pw_first) spmd();
    {
      Runtime rt(b->transport, b->runtime_options());
      time_pathways(*b, rt, t, r >= 0, pw_first, &out);
    }
    if (pw_first) spmd();
    const int timed = r + 1;  // timed rounds so far
    const bool more = timed < reps || timed % reps != 0 || (timed < 3 * reps && below());
    send_go(*b, more);
    if (!more) break;
  }
  // Every mode has a time from every timed round (SPMD's included), so the rows' round rates
  // pair by position.
  for (Mode m : {Mode::kSpmd, Mode::kOpByOp, Mode::kChained, Mode::kFused, Mode::kStatic}) {
    Row row{t == 0 ? 5 : 6, m, b->workers, 0, t, chain / best(out.times[m]), out.wrong[m], chain / median(out.times[m])};
    row.round_per_s = round_rates(chain, out.times[m]);
    rows->push_back(row);
  }
}

}  // namespace

void run_chains(Bench* b, std::vector<Row>* rows) {
  for (int64_t t : b->opt.ts) run_one_t(b, t, rows);
}

// Break-even: the smallest swept T from which on (every larger T too) mode/spmd >= 0.95. Also
// the first swept T that reaches 95% (a later T may dip below it again, e.g. when a neighbour
// process took a core).
ChainSummary summarize_chains(const Bench& b, const Results& res) {
  const std::vector<int64_t>& ts = b.opt.ts;
  ChainSummary sum;
  for (Mode mode : {Mode::kOpByOp, Mode::kChained}) {
    int64_t be = -1, first = -1;
    for (auto it = ts.rbegin(); it != ts.rend(); ++it) {
      if (res.rate(mode, *it) < 0.95 * res.spmd_rate(*it)) break;
      be = *it;
    }
    for (int64_t t : ts)
      if (first < 0 && res.rate(mode, t) >= 0.95 * res.spmd_rate(t)) first = t;
    auto js = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    sum.breakeven[mode_name(mode)] = js(be);
    sum.first_reach[mode_name(mode)] = js(first);
    std::printf("# break-even (>= 95%% of SPMD at this T and every larger one) %-8s %s (first T reaching 95%%: %s)\n",
                mode_name(mode), be >= 0 ? fmt::format("{} us", be).c_str() : "not reached",
                first >= 0 ? fmt::format("{} us", first).c_str() : "none");
  }
  for (auto& r : res.rows)
    if (r.mode == Mode::kFused && r.compute_us >= 1000)
      sum.fused_min = std::min(sum.fused_min, r.per_s / res.spmd_rate(r.compute_us));
  return sum;
}

}  // namespace pwm::pathways::bench
