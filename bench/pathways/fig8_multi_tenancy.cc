// Fig. 8: multi-tenancy. 1, 2, 4, 8, 16 clients (one thread and one Client each, all on a slice
// of every worker, so their programs' collectives overlap), each running short programs of one
// computation (T = 40 us, 330 us, 1 ms, 2.4 ms) and waiting for each result before the next, as
// a client whose next step depends on the last would: one client alone leaves the devices idle
// for a round trip per program, several interleave. Rows: aggregate computations per second,
// utilization = that over the SPMD rate at the same T (the best single-program utilization: the
// workers running the computations back to back; measured in the same rounds), and the kernels'
// busy fraction of the devices as the runtime counted it. Fig. 8's SPMD chain is as long as a
// client row. The paper's controller runs on hosts of its own; here it shares the cores with the
// workers unless launched as `mpirun --bind-to core -n 2` (1 worker, the controller on the other
// core), the layout mpi_scripts/dispatch_bench.sh uses for its Fig. 8 run.
#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "bench/pathways/dispatch_report.h"
#include "bench/pathways/figures.h"
#include "common/time.h"

namespace pwm::pathways::bench {

namespace {

// One row's measurement in one round.
struct ClientsSample {
  double rate = 0;  // computations/s over all clients
  double busy = 0;  // summed kernel time / (workers x wall)
  int wrong = 0;
};

// k clients on threads of their own, all started together, each running its programs one after
// the other; the row lasts about --fig8-seconds at full utilization.
ClientsSample run_clients(Runtime& rt, const Bench& b, int64_t t, int64_t k) {
  const int W = b.workers;
  const int per = std::max<int>(8, static_cast<int>(b.opt.fig8_seconds / (1e-6 * static_cast<double>(std::max<int64_t>(t, 1)) * k)));
  std::barrier start(static_cast<std::ptrdiff_t>(k + 1)), stop(static_cast<std::ptrdiff_t>(k + 1));
  std::vector<uint64_t> ids(k);
  std::vector<int> bad(k, 0);
  std::vector<std::thread> th;
  for (int64_t i = 0; i < k; ++i)
    th.emplace_back([&, i] {
      Client c = rt.client(fmt::format("fig8_c{}", i));
      ids[i] = c.id();
      Slice s = c.allocate(W);
      Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0});
      x = c.call("bench_step", s, {x}, {t})[0];  // lowered and loaded before the clock
      x.wait();
      start.arrive_and_wait();
      for (int j = 0; j < per; ++j) {
        x = c.call("bench_step", s, {x}, {t})[0];
        x.wait();  // the next program depends on this one's result
      }
      stop.arrive_and_wait();
      bad[i] = x.get<float>()[0] == static_cast<float>(per + 1) ? 0 : 1;
    });
  start.arrive_and_wait();
  const double t0 = now_s();
  stop.arrive_and_wait();
  const double wall = now_s() - t0;
  for (auto& x : th) x.join();
  double kernel_s = 0;
  for (auto& u : rt.usage())
    if (std::find(ids.begin(), ids.end(), u.id) != ids.end()) kernel_s += u.kernel_s;
  ClientsSample sample;
  for (int v : bad) sample.wrong += v;
  sample.rate = static_cast<double>(per * k) / wall;
  // The warm-up call of each client is in kernel_s too: subtract its share.
  sample.busy = kernel_s * per / (per + 1) / (W * wall);
  return sample;
}

// Rounds at T (a warm-up and --fig8-reps timed ones): the SPMD chain and a session running
// every client count, in the order pathways_first() gives. Appends T's rows to `rows`.
void run_one_t(Bench* b, int64_t t, std::vector<Row>* rows) {
  std::vector<double> spmd_times;
  std::map<int64_t, std::vector<double>> rates, busy;  // per client count
  std::map<int64_t, int> wrong;
  int wrong_spmd = 0;
  for (int r = -1;; ++r) {
    const bool pw_first = pathways_first(r + 1);  // (then the client counts in reverse too)
    const auto spmd = [&] {
      const SpmdRound sr = await_spmd_round(b);
      wrong_spmd += sr.wrong;
      if (r >= 0) spmd_times.push_back(sr.seconds);
    };
    if (!pw_first) spmd();
    Runtime rt(b->transport, b->runtime_options());
    std::vector<int64_t> ks = b->opt.clients;
    if (pw_first) std::reverse(ks.begin(), ks.end());
    for (int64_t k : ks) {
      const ClientsSample s = run_clients(rt, *b, t, k);
      wrong[k] += s.wrong;
      if (r >= 0) {
        rates[k].push_back(s.rate);
        busy[k].push_back(s.busy);
      }
    }
    rt.shutdown();
    if (pw_first) spmd();
    const bool more = r + 1 < b->opt.fig8_reps;
    send_go(*b, more);
    if (!more) break;
  }
  const int n = b->opt.fig8_chain(t);
  Row spmd{8, Mode::kSpmd, b->workers, 0, t, n / best(spmd_times), wrong_spmd, n / median(spmd_times)};
  spmd.round_per_s = round_rates(n, spmd_times);  // round i's, as every clients row's rates[k][i]
  rows->push_back(spmd);
  for (int64_t k : b->opt.clients) {
    Row row{8, Mode::kClients, b->workers, 0, t, *std::max_element(rates[k].begin(), rates[k].end()), wrong[k],
            median(rates[k])};
    row.clients = static_cast<int>(k);
    row.busy = *std::max_element(busy[k].begin(), busy[k].end());
    row.round_per_s = rates[k];
    rows->push_back(row);
  }
}

}  // namespace

void run_multi_tenancy(Bench* b, std::vector<Row>* rows) {
  for (int64_t t : b->opt.fig8_ts) run_one_t(b, t, rows);
}

// Utilization = aggregate computations/s over the SPMD rate at the same T. Best over best and
// median over median: a round's speed drifts with the VM, so the median ratio is the steadier of
// the two (both are printed and written).
MultiTenancySummary summarize_multi_tenancy(const Bench& b, const Results& res) {
  MultiTenancySummary sum;
  if (b.opt.fig8_ts.empty()) return sum;
  std::printf("# fig 8: clients each running 1-computation programs, waiting for each result; best of %d rounds\n",
              b.opt.fig8_reps);
  std::printf("%10s %7s %14s %12s %10s %8s %10s %6s\n", "compute_us", "clients", "computations/s", "util_vs_spmd",
              "vs_1client", "busy", "util_med", "#wrong");
  for (auto& r : res.rows) {
    if (r.fig != 8) continue;
    const double base = res.spmd_rate(r.compute_us, true), one = res.one_client(r.compute_us);
    if (r.mode == Mode::kSpmd) {
      std::printf("%10lld %7s %14.1f %12s %10s %8s %10s %6d\n", static_cast<long long>(r.compute_us), "spmd",
                  r.per_s, "1.000", "-", "-", "1.000", r.wrong);
      continue;
    }
    const double med = res.median_util(r);
    std::printf("%10lld %7d %14.1f %12.3f %10.3f %8.3f %10.3f %6d\n", static_cast<long long>(r.compute_us),
                r.clients, r.per_s, base > 0 ? r.per_s / base : 0.0, one > 0 ? r.per_s / one : 0.0, r.busy, med,
                r.wrong);
    if (r.clients >= 4 && base > 0) {
      const std::string key = std::to_string(r.compute_us);
      const double u = r.per_s / base;
      if (!sum.worst.contains(key) || u < sum.worst[key].get<double>()) sum.worst[key] = u;
      if (!sum.worst_median.contains(key) || med < sum.worst_median[key].get<double>()) sum.worst_median[key] = med;
    }
  }
  for (auto& [k, v] : sum.worst.items())
    std::printf("# fig 8: T = %s us, >= 4 clients: worst utilization %.3f of SPMD best-over-best, %.3f median-over-median "
                "(target for 330 us: 0.95)\n",
                k.c_str(), v.get<double>(), sum.worst_median[k].get<double>());
  return sum;
}

void add_multi_tenancy_fields(const Results& res, const Row& r, nlohmann::json* o) {
  if (r.mode == Mode::kClients) {
    (*o)["clients"] = r.clients;
    (*o)["busy_fraction"] = r.busy;
    const double one = res.one_client(r.compute_us);
    (*o)["vs_one_client"] = one > 0 ? r.per_s / one : 0.0;
  }
  const double base = res.spmd_rate(r.compute_us, true);
  (*o)["utilization_vs_spmd"] = base > 0 ? r.per_s / base : 0.0;
  (*o)["median_utilization_vs_spmd"] = res.median_util(r);
}

}  // namespace pwm::pathways::bench
