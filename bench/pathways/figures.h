// dispatch_bench's figures, one file each, plugged into the harness (dispatch_harness.h). Each
// run_* is the controller's side of its figure (world rank 0 only; the workers follow in
// run_workers) and appends the figure's rows to `rows`. The summaries read the rows of the whole
// run (Results, dispatch_report.h) and print the figure's lines of the report.
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "bench/pathways/dispatch_harness.h"

namespace pwm::pathways::bench {

class Results;

// ---- Fig. 5/6 (fig5_6_chains.cc) --------------------------------------------------------------
// A chain of --chain computations run four ways per T of --compute-us: spmd (the workers alone),
// opbyop (one program per computation), chained (one traced program), fused (one kernel). Rows:
// fig 5 at T = 0, else fig 6, one per mode.
void run_chains(Bench* b, std::vector<Row>* rows);

struct ChainSummary {
  nlohmann::json breakeven, first_reach;  // per mode (opbyop, chained): T in us, or null
  double fused_min = 1e9;                 // worst fused / spmd at T >= 1 ms; 1e9 if none
};
// Prints the break-even lines (always, one per mode) and returns them with the fused ratio.
ChainSummary summarize_chains(const Bench& b, const Results& res);

// ---- Fig. 7 (fig7_pipeline.cc) ----------------------------------------------------------------
// A pipeline of k stages (each of --stages) over 1-device slices, parallel vs sequential
// dispatch. Rows: fig 7, one per k and dispatch.
void run_pipeline(const Bench& b, std::vector<Row>* rows);

// ---- Fig. 8 (fig8_multi_tenancy.cc) -----------------------------------------------------------
// Several clients, each waiting for every program's result, per T of --fig8-us. Rows: fig 8,
// one spmd row per T and one clients row per client count.
void run_multi_tenancy(Bench* b, std::vector<Row>* rows);

struct MultiTenancySummary {
  // Per T: the worst utilization at >= 4 clients, best over best and median over median.
  nlohmann::json worst = nlohmann::json::object(), worst_median = nlohmann::json::object();
};
// Prints Fig. 8's table and its worst-utilization lines when Fig. 8 ran.
MultiTenancySummary summarize_multi_tenancy(const Bench& b, const Results& res);
// The JSON fields of a fig 8 row beyond the common ones.
void add_multi_tenancy_fields(const Results& res, const Row& r, nlohmann::json* o);

}  // namespace pwm::pathways::bench
