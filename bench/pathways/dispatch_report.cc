#include "bench/pathways/dispatch_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "bench/pathways/figures.h"
#include "common/atomic_file.h"
#include "common/check.h"

namespace pwm::pathways::bench {

double Results::spmd_rate(int64_t t, bool fig8, bool use_median) const {
  for (auto& r : rows)
    if (r.mode == Mode::kSpmd && r.compute_us == t && (r.fig == 8) == fig8) return use_median ? r.median_per_s : r.per_s;
  return 0.0;
}

double Results::rate(Mode mode, int64_t t) const {
  for (auto& r : rows)
    if (r.mode == mode && r.compute_us == t) return r.per_s;
  return 0.0;
}

double Results::effective_us(int64_t t) const {
  const double r0 = spmd_rate(0), rt = spmd_rate(t);
  return r0 > 0 && rt > 0 ? 1e6 / rt - 1e6 / r0 : -1.0;
}

double Results::one_client(int64_t t) const {
  for (auto& r : rows)
    if (r.fig == 8 && r.clients == 1 && r.compute_us == t) return r.per_s;
  return 0.0;
}

double Results::median_util(const Row& r) const {
  const double base = spmd_rate(r.compute_us, true, true);
  return base > 0 ? r.median_per_s / base : 0.0;
}

namespace {

// The table of fig 5, 6 and 7 (fig 8 has its own, figures.h). Returns #wrong over every row.
int print_rows(const Bench& b, const Results& res) {
  std::printf("# dispatch_bench: %d workers + 1 controller, chain %d, best of %d reps, busy loop %.0f iters/us\n",
              b.workers, b.opt.chain, b.opt.reps, b.iters_per_us);
  std::printf("%4s %-10s %7s %6s %10s %8s %14s %8s %6s\n", "fig", "mode", "workers", "stages", "compute_us",
              "eff_us", "computations/s", "vs_spmd", "#wrong");
  int total_wrong = 0;
  for (auto& r : res.rows) {
    total_wrong += r.wrong;
    if (r.fig == 8) continue;
    const double base = r.fig == 7 ? 0 : res.spmd_rate(r.compute_us);
    const double eff = r.fig == 7 ? -1 : res.effective_us(r.compute_us);
    std::printf("%4d %-10s %7d %6d %10lld %8s %14.1f %8s %6d\n", r.fig, mode_name(r.mode), r.workers, r.stages,
                static_cast<long long>(r.compute_us), eff >= 0 ? fmt::format("{:.1f}", eff).c_str() : "-", r.per_s,
                base > 0 ? fmt::format("{:.3f}", r.per_s / base).c_str() : "-", r.wrong);
  }
  return total_wrong;
}

nlohmann::json row_json(const Results& res, const Row& r) {
  nlohmann::json o{{"fig", std::to_string(r.fig)}, {"mode", mode_name(r.mode)}, {"workers", r.workers},
                   {"compute_us", r.compute_us}, {"computations_per_s", r.per_s},
                   {"median_computations_per_s", r.median_per_s}, {"wrong", r.wrong},
                   {"round_computations_per_s", r.round_per_s}};
  if (r.fig == 7) o["stages"] = r.stages;
  if (r.fig != 7 && r.fig != 8 && res.effective_us(r.compute_us) >= 0)
    o["effective_compute_us"] = res.effective_us(r.compute_us);
  if (r.fig == 8) add_multi_tenancy_fields(res, r, &o);
  return o;
}

void write_json(const Bench& b, const Results& res, const ChainSummary& chains, const MultiTenancySummary& fig8,
                double controller_cpu_fraction) {
  const std::string& path = b.opt.json_path;
  nlohmann::json j;
  j["workers"] = b.workers;
  j["chain"] = b.opt.chain;
  j["reps"] = b.opt.reps;
  j["busy_iters_per_us"] = b.iters_per_us;
  j["rows"] = nlohmann::json::array();
  for (auto& r : res.rows) j["rows"].push_back(row_json(res, r));
  j["breakeven_us"] = chains.breakeven;
  j["first_reach_95_us"] = chains.first_reach;
  j["controller_cpu_fraction"] = controller_cpu_fraction;
  if (!fig8.worst.empty()) j["fig8_worst_utilization_4plus_clients"] = fig8.worst;
  if (!fig8.worst_median.empty()) j["fig8_worst_median_utilization_4plus_clients"] = fig8.worst_median;
  if (chains.fused_min < 1e9) j["fused_vs_spmd_at_1ms_worst"] = chains.fused_min;
  write_file_atomic(path, j.dump(2) + "\n", "--json");
}

}  // namespace

int report(const Bench& b, const Results& res, double wall, double cpu) {
  const int total_wrong = print_rows(b, res);
  const ChainSummary chains = summarize_chains(b, res);
  const MultiTenancySummary fig8 = summarize_multi_tenancy(b, res);
  if (chains.fused_min < 1e9) std::printf("# fused / spmd at T >= 1 ms: %.4f (worst)\n", chains.fused_min);
  std::printf("# controller (rank 0) CPU: %.2f s in %.2f s wall (%.1f%% of one core)\n", cpu, wall, 100 * cpu / wall);
  std::printf("# #wrong total: %d\n", total_wrong);
  if (!b.opt.json_path.empty()) write_json(b, res, chains, fig8, cpu / wall);
  return total_wrong == 0 ? 0 : 2;
}

}  // namespace pwm::pathways::bench
