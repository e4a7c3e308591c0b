// The dispatch benchmarks (bench/pathways/dispatch_bench.cc, the paper's Fig. 5-8) simulated.
//
// Programs are built as dispatch_bench builds them (a ProgramDef of the same kernels' signatures)
// and lowered by dataflow::lower(): the nodes, the workers that get a message per run and the
// stages come from the lowered per-worker programs. Costs (Profile, scaled by the cluster's
// dispatch_scale): the controller pays call_us per client call, node_us per node and msg_us per
// worker message of a run, serially (one dispatcher thread); a message reaches a worker after
// the link from the controller's host; a worker pays exec_us per kernel launch, then T of
// compute (T is given as device time: never scaled), then the kernel's scalar AllReduce over its
// slice (simulated by its schedule) and program_exec_us per computation (the SPMD loop pays
// spmd_exec_us for the same work); a client's fetch of a result costs fetch_rtt_us after the
// result exists.
//
// The controller sits on host 0 with device 0's worker unless `controller_alone` (its own host,
// the paper's layout). With `host_executors`, a run sends one message per host instead of per
// device (the paper's per-host executors; this runtime has one worker per device).
#pragma once

#include <string>
#include <vector>

#include "sim/sim.h"

namespace pwm::sim {

struct DispatchOptions {
  int workers = 2;        // devices 0..workers-1
  int chain = 128;        // computations per chain (Fig. 5/6)
  bool controller_alone = false;
  bool host_executors = false;
};

// What lower() made of a program: nodes, per-run worker messages, kernel launches per worker.
struct LoweredShape {
  int nodes = 0, messages = 0, stages = 0;
  std::vector<int> execs;  // per worker in the program, in rank order
};

// What a chain's simulation needs that does not depend on T: the three lowered programs and the
// kernel's scalar AllReduce (simulated once; every T reuses them).
struct ChainInputs {
  LoweredShape opbyop, chained, fused;
  double allreduce_us = 0;
};
ChainInputs prepare_chain(const Cluster& c, const Profile& p, const DispatchOptions& o);

// Computations per second of one chain at compute time `t_us`: mode kSpmd, kOpByOp,
// kChained or kFused. `pre`: prepare_chain's result for the same c, p, o (or null).
double simulate_chain(const Cluster& c, const Profile& p, const DispatchOptions& o, ExecMode mode,
                      double t_us, const ChainInputs* pre = nullptr);

// dispatch_bench's static chain (mode "static"): the chained program of o.chain computations run
// by the workers' static executors alone, no controller (the profile's static costs; throws
// pwm::Error without them). Computations per second at compute time `t_us`.
double simulate_static_chain(const Cluster& c, const Profile& p, const DispatchOptions& o, double t_us,
                             const ChainInputs* pre = nullptr);

// The smallest T (from `ts`, ascending) from which on `mode` reaches `frac` of SPMD at every
// larger T; -1 when none does.
double break_even(const Cluster& c, const Profile& p, const DispatchOptions& o, ExecMode mode,
                  const std::vector<double>& ts, double frac = 0.95);

// Fig. 7: a pipeline of `stages` single-device stages of `stage_us` on alternating workers,
// parallel or sequential dispatch: seconds per pipeline run.
double simulate_stages(const Cluster& c, const Profile& p, const DispatchOptions& o, int stages, double stage_us,
                       bool sequential);

// Fig. 8: `clients` clients each calling one-computation programs of `t_us` on every worker and
// waiting for each result: aggregate computations per second over `programs` calls per client.
double simulate_clients(const Cluster& c, const Profile& p, const DispatchOptions& o, int clients, double t_us,
                        int programs = 64);

LoweredShape lowered_chain(int workers, int nodes, bool fused);
LoweredShape lowered_stages(int workers, int stages);

}  // namespace pwm::sim
