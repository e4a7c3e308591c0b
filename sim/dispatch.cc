#include "sim/dispatch.h"

#include <algorithm>
#include <map>

#include "common/check.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "sim/collective.h"
#include "sim/engine.h"

namespace pwm::sim {


namespace {

// dispatch_bench's kernels by signature (a float32[1] in and out; bench_step and bench_fused run
// a collective over their slice). The simulator never runs them.
const dataflow::KernelRegistry& bench_registry() {
  static const dataflow::KernelRegistry* reg = [] {
    auto* r = new dataflow::KernelRegistry;
    const dataflow::ArgSpec scalar{{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated};
    const dataflow::Signature sig{{scalar}, {scalar}};
    auto none = [](dataflow::KernelContext&) {};
    r->add("bench_step", sig, none, true);
    r->add("bench_fused", sig, none, true);
    r->add("bench_stage", sig, none, false);
    return r;
  }();
  return *reg;
}

// Slice i: `sizes[i]` workers starting at world rank 1 + starts[i] (rank 0 is the controller).
LoweredShape shape_of(const dataflow::ProgramDef& def, const std::vector<std::pair<int, int>>& slices) {
  PWM_CHECK(def.error.empty(), "sim: program: {}", def.error);
  const auto lp = dataflow::lower(def, 1, [&](int id) {
    dataflow::SliceMapping m;
    for (int k = 0; k < slices.at(id).second; ++k) m.ranks.push_back(1 + slices[id].first + k);
    m.context = static_cast<uint32_t>(id + 1);
    return m;
  });
  LoweredShape s;
  s.nodes = static_cast<int>(def.nodes.size());
  s.messages = static_cast<int>(lp.workers.size());
  s.stages = static_cast<int>(lp.stage_ranks.size());
  for (const auto& [rank, wp] : lp.workers) s.execs.push_back(static_cast<int>(wp.execs.size()));
  return s;
}

double ctrl_link_arrival(const Cluster& c, const DispatchOptions& o, int worker, double t) {
  const bool cross = o.controller_alone ? c.hosts > 1 : c.host_of(worker) != 0;
  const Link& l = c.has_controller_link ? c.controller_link : cross ? c.inter : c.intra;
  return t + l.overhead_us + l.latency_us;
}

// Duration of one scalar AllReduce over devices 0..w-1 entered together (the kernel's
// Communicator picks the algorithm: kAuto on 4 bytes).
double scalar_allreduce_us(const Cluster& c, const Profile& p, int w) {
  std::vector<int> devs(w);
  for (int i = 0; i < w; ++i) devs[i] = i;
  return simulate_allreduce(c, p, devs, 4).end;
}

// The controller shares its host's cores with the workers there (cores_per_host > 0 and more
// processes than cores: the machine here, 3 processes on 2 cores). Then its CPU work is not
// overlapped with the workers' kernels but time-shared with them: while it works, a worker
// on its core is descheduled, and the gang's AllReduce waits for that worker.
bool controller_shares_cores(const Cluster& c, const DispatchOptions& o) {
  if (c.cores_per_host <= 0 || o.controller_alone) return false;
  const int on_host0 = c.hosts_share_cores ? o.workers : std::min(o.workers, c.devices_per_host);
  return on_host0 + 1 > c.cores_per_host;
}

int run_messages(const Cluster& c, const DispatchOptions& o, const LoweredShape& s) {
  if (!o.host_executors) return s.messages;
  return (std::min(o.workers, c.devices()) + c.devices_per_host - 1) / c.devices_per_host;
}

}  // namespace

LoweredShape lowered_chain(int workers, int nodes, bool fused) {
  const auto& reg = bench_registry();
  dataflow::ProgramDef def;
  const dataflow::ArgSpec scalar{{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated};
  dataflow::ValueId v{-1, def.add_param(0, workers, scalar)};
  if (fused) {
    v = {def.add_call(reg, "bench_fused", 0, workers, {v}, {nodes, 0}), 0};
  } else {
    for (int i = 0; i < nodes; ++i) v = {def.add_call(reg, "bench_step", 0, workers, {v}, {0}), 0};
  }
  def.outputs.push_back(v);
  return shape_of(def, {{0, workers}});
}

LoweredShape lowered_stages(int workers, int stages) {
  const auto& reg = bench_registry();
  dataflow::ProgramDef def;
  const dataflow::ArgSpec scalar{{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated};
  std::vector<std::pair<int, int>> slices;
  for (int w = 0; w < workers; ++w) slices.push_back({w, 1});
  dataflow::ValueId v{-1, def.add_param(0, 1, scalar)};
  for (int s = 0; s < stages; ++s) v = {def.add_call(reg, "bench_stage", s % workers, 1, {v}, {0}), 0};
  def.outputs.push_back(v);
  return shape_of(def, slices);
}

ChainInputs prepare_chain(const Cluster& c, const Profile& p, const DispatchOptions& o) {
  if (o.workers < 1 || o.workers > c.devices()) PWM_THROW("{} workers need 1..{} devices", o.workers, c.devices());
  ChainInputs in;
  in.opbyop = lowered_chain(o.workers, 1, false);
  in.chained = lowered_chain(o.workers, o.chain, false);
  in.fused = lowered_chain(o.workers, o.chain, true);
  in.allreduce_us = scalar_allreduce_us(c, p, o.workers);
  return in;
}

double simulate_chain(const Cluster& c, const Profile& p, const DispatchOptions& o, ExecMode mode,
                      double t_us, const ChainInputs* pre) {
  ChainInputs own;
  if (pre == nullptr) {
    own = prepare_chain(c, p, o);
    pre = &own;
  }
  const int w = o.workers, k = o.chain;
  const double ar = pre->allreduce_us;
  const double ds = 1.0 / c.dispatch_scale, comp = t_us;  // T is device time already
  if (mode == ExecMode::kSpmd) return k / (k * (comp + ar + p.spmd_exec_us * ds) * 1e-6);
  double end = 0;
  if (mode == ExecMode::kOpByOp) {
    // One single-node program per computation; the controller issues call after call (each
    // takes the previous future), the workers run them as they arrive.
    const LoweredShape& s = pre->opbyop;
    const double per_call = (p.call_us + p.node_us * s.nodes + p.msg_us * run_messages(c, o, s)) * ds;
    // Shared cores: the controller's next call is prepared while this kernel runs, on a core
    // a worker needs: the kernel is stretched by the part of that call falling inside it.
    const bool shared = controller_shares_cores(c, o);
    double ctrl = 0, dev = 0;
    for (int j = 0; j < k; ++j) {
      ctrl += per_call;
      double start = 0;
      for (int r = 0; r < w; ++r) start = std::max(start, ctrl_link_arrival(c, o, r, ctrl));
      const double stolen = shared && j + 1 < k ? std::min(comp, per_call) : 0.0;
      dev = std::max(dev, start) + p.exec_us * ds + comp + stolen + ar + p.program_exec_us * ds;
    }
    end = dev;
  } else {  // chained or fused: one program per chain
    const LoweredShape& s = mode == ExecMode::kFused ? pre->fused : pre->chained;
    const double ctrl = (p.call_us + p.node_us * s.nodes + p.msg_us * run_messages(c, o, s)) * ds;
    double start = 0;
    for (int r = 0; r < w; ++r) start = std::max(start, ctrl_link_arrival(c, o, r, ctrl));
    const int launches = s.execs.empty() ? 0 : *std::max_element(s.execs.begin(), s.execs.end());
    end = start + launches * p.exec_us * ds + k * (comp + ar + p.program_exec_us * ds);
  }
  end += p.fetch_rtt_us * ds;
  return k / (end * 1e-6);
}

double simulate_static_chain(const Cluster& c, const Profile& p, const DispatchOptions& o, double t_us,
                             const ChainInputs* pre) {
  const Profile::StaticCosts& s = p.static_costs();
  // The controller asleep (dispatch_bench times it in the SPMD phase): nothing steals the cores.
  // Per run the executor's set-up, per computation T, the AllReduce and the executor's own cost.
  const double ar = pre != nullptr ? pre->allreduce_us : prepare_chain(c, p, o).allreduce_us;
  const double ds = 1.0 / c.dispatch_scale;
  const double end = s.run_us * ds + o.chain * (t_us + ar + s.exec_us * ds);
  return o.chain / (end * 1e-6);
}

double break_even(const Cluster& c, const Profile& p, const DispatchOptions& o, ExecMode mode,
                  const std::vector<double>& ts, double frac) {
  const ChainInputs pre = prepare_chain(c, p, o);
  double be = -1;
  for (auto it = ts.rbegin(); it != ts.rend(); ++it) {
    if (simulate_chain(c, p, o, mode, *it, &pre) < frac * simulate_chain(c, p, o, ExecMode::kSpmd, *it, &pre)) break;
    be = *it;
  }
  return be;
}

double simulate_stages(const Cluster& c, const Profile& p, const DispatchOptions& o, int stages, double stage_us,
                       bool sequential) {
  const int w = o.workers;
  const LoweredShape s = lowered_stages(w, stages);
  const double ds = 1.0 / c.dispatch_scale, comp = stage_us / c.compute_scale;
  // Parallel: one run message per worker at once, every stage released; a stage starts when the
  // previous stage's 4-byte output arrived from the other worker. Sequential: the controller
  // releases stage i + 1 after it heard stage i finished (a round trip and a dispatch each).
  const double ctrl = (p.call_us + p.node_us * s.nodes + p.msg_us * run_messages(c, o, s)) * ds;
  double t = 0;
  const double release_all = ctrl;
  double prev_end = 0;
  for (int i = 0; i < stages; ++i) {
    const int wk = i % w;
    double ready = ctrl_link_arrival(c, o, wk, sequential ? (i == 0 ? release_all : 0) : release_all);
    if (i > 0) {
      const int from = (i - 1) % w;
      ready = std::max(ready, from == wk ? prev_end : message_arrival(c, from, wk, 4, prev_end));
      if (sequential) {
        const double noticed = ctrl_link_arrival(c, o, from, prev_end);  // the completion notice back
        ready = std::max(ready, ctrl_link_arrival(c, o, wk, noticed + (p.node_us + p.msg_us) * ds));
      }
    }
    prev_end = ready + p.exec_us * ds + comp;
    t = prev_end;
  }
  return (t + p.fetch_rtt_us * ds) * 1e-6;
}

double simulate_clients(const Cluster& c, const Profile& p, const DispatchOptions& o, int clients, double t_us,
                        int programs) {
  // A small event simulation: one controller thread (serial), the workers as one gang (every
  // program runs on every worker, in the order the controller dispatched them), and each client
  // issuing its next call when its last result was fetched.
  const int w = o.workers;
  const LoweredShape s = lowered_chain(w, 1, false);
  const double ds = 1.0 / c.dispatch_scale, comp = t_us;  // T is device time already
  const double per_call = (p.call_us + p.node_us * s.nodes + p.msg_us * run_messages(c, o, s)) * ds;
  const double run = p.exec_us * ds + comp + scalar_allreduce_us(c, p, w);
  Engine eng;
  Serial ctrl, gang;
  int done = 0;
  std::function<void(int, int)> issue = [&](int client, int left) {
    const double sent = ctrl.book(eng.now(), per_call);
    double arrive = 0;
    for (int r = 0; r < w; ++r) arrive = std::max(arrive, ctrl_link_arrival(c, o, r, sent));
    const double fin = gang.book(arrive, run);
    eng.at(fin + p.fetch_rtt_us * ds, [&, client, left] {
      done += 1;
      if (left > 1) issue(client, left - 1);
    });
  };
  for (int i = 0; i < clients; ++i) eng.at(0, [&, i] { issue(i, programs); });
  eng.run();
  return done / (eng.now() * 1e-6);
}

}  // namespace pwm::sim
