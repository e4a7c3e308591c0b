#include "sim/step.h"

#include <algorithm>
#include <functional>
#include <map>

#include "common/check.h"
#include "model/params.h"
#include "sim/collective.h"
#include "sim/engine.h"

namespace pwm::sim {

using model::Unit;
using model::UnitKind;

UnitFlops unit_flops(const model::Config& m, const model::StepPlan& plan, const Unit& u, int64_t seqs) {
  // Per token: a matrix of P parameters costs 2P forward and 4P backward; attention's score and
  // value products 4 H D T forward per layer (Config::flops_per_token()'s 12 H D T over fwd+bwd).
  const double tokens = static_cast<double>(seqs * m.seq_len);
  const double head = static_cast<double>(m.vocab * m.d_model);  // the tied output projection
  UnitFlops f;
  switch (u.kind) {
    case UnitKind::kBatch: break;
    case UnitKind::kEmbedForward: f.fwd = 2.0 * static_cast<double>(m.d_model) * tokens; break;
    case UnitKind::kEmbedBackward: f.bwd = 2.0 * static_cast<double>(m.d_model) * tokens; break;
    case UnitKind::kHead:
      f.fwd = 2.0 * head * tokens;
      f.bwd = 4.0 * head * tokens;
      break;
    case UnitKind::kBlockForward:
    case UnitKind::kBlockBackward: {
      const double pl = static_cast<double>(plan.piece_size(model::StepPlan::layer_piece(u.layer)));
      const double attn = 4.0 * static_cast<double>(m.n_heads * m.head_dim * m.seq_len);
      if (u.kind == UnitKind::kBlockForward) f.fwd = (2.0 * pl + attn) * tokens;
      else f.bwd = 2.0 * (2.0 * pl + attn) * tokens;
      break;
    }
  }
  return f;
}

UnitFlops micro_flops(const model::Config& m, const model::StepPlan& plan, int64_t seqs) {
  UnitFlops s;
  for (const Unit& u : plan.forward_units(0)) {
    const UnitFlops f = unit_flops(m, plan, u, seqs);
    s.fwd += f.fwd, s.bwd += f.bwd;
  }
  for (const Unit& u : plan.backward_units(0)) {
    const UnitFlops f = unit_flops(m, plan, u, seqs);
    s.fwd += f.fwd, s.bwd += f.bwd;
  }
  return s;
}

namespace {

struct Ctx {
  const Cluster& c;
  const Profile& p;
  const train::TrainConfig& cfg;
  model::ParamLayout layout;
  model::StepPlan plan;
  double slow;  // compute slowdown (cluster scale, contention)
  Ctx(const Cluster& c_, const Profile& p_, const train::TrainConfig& cfg_, int ranks_per_host)
      : c(c_), p(p_), cfg(cfg_), layout(cfg_.model, 0, 1), plan(layout, cfg_.workload.microbatches) {
    slow = 1.0 / c.compute_scale;
    if (c.cores_per_host > 0 && ranks_per_host > 1) slow *= p.contention_factor(ranks_per_host);
  }
  double unit_us(const Unit& u, int64_t seqs) const {
    const UnitFlops f = unit_flops(cfg.model, plan, u, seqs);
    // The rate of a kernel of this many tokens in a model this wide (Profile::rates and
    // width_scales: the cache and the matrices' shapes, not only the FLOPs).
    const Profile::KernelRate r = p.rate_at(static_cast<double>(seqs * cfg.model.seq_len), static_cast<double>(cfg.model.d_model));
    return slow * (f.fwd * 1e-9 * r.fwd_us_per_gflop + f.bwd * 1e-9 * r.bwd_us_per_gflop);
  }
  double update_us(int64_t params) const { return slow * p.opt_us_per_param * static_cast<double>(params); }
  double disp(double us) const { return us / c.dispatch_scale; }
};

// What the trainer running granularity `g` under model `m` adds beyond the units and the
// collectives: processes beside the devices on their cores, a cost per node and one per step
// (us, before the cluster's dispatch_scale).
struct TrainerCosts {
  int extra_procs = 0;  // pathways_train's controller; none in spmd_train and mpmd_train
  double node_us = 0, step_us = 0;
};

TrainerCosts trainer_costs(const Profile& p, ExecMode g, MpmdModel m) {
  if (g == ExecMode::kSpmd) {
    if (m == MpmdModel::kStatic) PWM_THROW("--mpmd static runs --granularity fused or chained (spmd is spmd_train)");
    return {};
  }
  if (m == MpmdModel::kStatic) {
    if (g == ExecMode::kOpByOp) PWM_THROW("--mpmd static has no --granularity opbyop (no client to call node by node)");
    const Profile::StaticCosts& s = p.static_costs();
    // Fused: the one node of the step pays the executor's cost once, beside the step's own.
    return g == ExecMode::kFused ? TrainerCosts{0, 0, s.step_us + s.node_us} : TrainerCosts{0, s.node_us, s.step_us};
  }
  const bool per_node = g == ExecMode::kChained || g == ExecMode::kOpByOp;
  return {1, per_node ? p.exec_us + p.train_node_us : 0.0, g == ExecMode::kFused ? p.step_kernel_us : p.node_step_us};
}

std::vector<int> first_devices(int n) {
  std::vector<int> d(n);
  for (int i = 0; i < n; ++i) d[i] = i;
  return d;
}

}  // namespace

StepPrediction simulate_step(const Cluster& c, const Profile& p, const train::TrainConfig& cfg,
                             ExecMode granularity, MpmdModel model) {
  if (cfg.mesh.tp != 1) PWM_THROW("--tp {} is not simulated (tp = 1 only)", cfg.mesh.tp);
  const int dp = static_cast<int>(cfg.mesh.dp);
  if (dp > c.devices()) PWM_THROW("--dp {} needs {} devices, the cluster has {}", dp, dp, c.devices());
  const TrainerCosts tc = trainer_costs(p, granularity, model);
  // Ranks sharing a host's cores: the Pathways controller is one more process on host 0.
  const int per_host = (c.hosts_share_cores ? dp : std::min(dp, c.devices_per_host)) + tc.extra_procs;
  Ctx x(c, p, cfg, per_host);
  const std::vector<int> devs = first_devices(dp);
  const int64_t seqs = cfg.micro_batch();
  // The emulated network's CPU (Link::cpu_ns_per_byte): what each rank sends and receives across
  // hosts in the step's gradient AllReduces (a ring laid out host by host: 2 (dp-1)/dp of the
  // buffer each way, on the hops that cross hosts) is time the kernels do not get.
  const int hosts_used = (dp + c.devices_per_host - 1) / c.devices_per_host;
  if (dp > 1 && c.hosts_share_cores && hosts_used > 1 && c.inter.cpu_ns_per_byte > 0) {
    const double grad_bytes = 4.0 * static_cast<double>(x.layout.total());
    const double bytes = 2.0 * (2.0 * (dp - 1) / dp) * grad_bytes * hosts_used / dp;
    double kernels_us = x.update_us(x.layout.total());
    for (const Unit& u : x.plan.units()) kernels_us += x.unit_us(u, seqs);
    x.slow *= 1.0 + bytes * c.inter.cpu_ns_per_byte * 1e-3 / kernels_us;
  }
  StepPrediction r;
  double t = 0;
  // The units of the whole step on one device (every dp rank runs the same ones).
  std::map<int, double> finished_at;  // finish_order index -> time (last micro-batch)
  const bool per_node = granularity == ExecMode::kChained || granularity == ExecMode::kOpByOp;
  const double node_cost = x.disp(tc.node_us);
  const double call_cost = granularity == ExecMode::kOpByOp ? x.disp(p.call_us + p.train_call_us + p.msg_us * dp) : 0.0;
  double controller = 0;  // opbyop: when the controller has issued the next call
  // More processes than cores on the host: the controller's next call is time-shared with the
  // running unit, not overlapped with it (as in simulate_chain, sim/dispatch.cc).
  const bool shared = c.cores_per_host > 0 && per_host > c.cores_per_host;
  for (const Unit& u : x.plan.units()) {
    const double k = x.unit_us(u, seqs);
    r.compute_us += k;
    if (granularity == ExecMode::kOpByOp) {
      controller += call_cost;
      t = std::max(t, controller);
      if (shared) t += std::min(k, call_cost);
    }
    t += k + node_cost;
    r.nodes += per_node ? 1 : 0;
    const int f = x.plan.finishes(u);
    if (f >= 0 && u.micro == cfg.workload.microbatches - 1) finished_at[f] = t;
  }
  const double compute_end = t;
  double comm_end = compute_end;
  if (dp > 1) {
    if (per_node) {
      // One AllReduce node per gradient piece after the units (programs/trace_impl.h), in piece order.
      for (int piece = 0; piece < x.plan.num_pieces(); ++piece) {
        if (granularity == ExecMode::kOpByOp) controller += call_cost;
        const double st = std::max(comm_end, controller) + node_cost;
        const size_t bytes = static_cast<size_t>(x.plan.piece_size(piece)) * 4;
        comm_end = simulate_allreduce(c, p, devs, bytes, collectives::Algorithm::kAuto,
                                      std::vector<double>(dp, st)).end;
        r.collectives += 1;
        r.nodes += 1;
      }
    } else {
      const std::vector<std::pair<int64_t, int64_t>>& units = x.plan.finish_order();
      double prev = 0;
      for (const BucketCut& b : cut_buckets(units, cfg.exec.bucket_bytes)) {
        const double ready = cfg.exec.overlap ? finished_at.at(b.last_unit) : compute_end;
        const double st = std::max(ready, prev);
        prev = simulate_allreduce(c, p, devs, static_cast<size_t>(b.end - b.begin) * 4,
                                  collectives::Algorithm::kAuto, std::vector<double>(dp, st)).end;
        r.collectives += 1;
      }
      comm_end = std::max(compute_end, prev);
    }
    // The global norm: one float64 scalar, recursive doubling (spmd/trainer.cc).
    comm_end = simulate_allreduce(c, p, devs, 8, collectives::Algorithm::kRecursiveDoubling,
                                  std::vector<double>(dp, comm_end)).end;
    r.collectives += 1;
  }
  if (granularity == ExecMode::kOpByOp) {  // the update node is a call of its own too
    controller += call_cost;
    comm_end = std::max(comm_end, controller);
  }
  const double upd = x.update_us(x.layout.total()) + node_cost;
  r.nodes += per_node ? 1 : 0;
  r.compute_us += x.update_us(x.layout.total());
  const double overhead = p.step_overhead_us + p.microbatch_overhead_us * static_cast<double>(cfg.workload.microbatches - 1);
  double step = comm_end + upd + overhead;
  step += x.disp(tc.step_us);
  r.step_us = step;
  r.exposed_comm_us = step - r.compute_us - overhead;
  r.tokens_per_s = static_cast<double>(cfg.tokens_per_step()) / (step * 1e-6);
  return r;
}

PipelineTimes pipeline_times(const std::vector<double>& dur_f, const std::vector<double>& dur_b, int64_t M,
                             train::Schedule schedule, const std::function<double(int, int, double)>& arrive) {
  const int S = static_cast<int>(dur_f.size());
  // Each stage's work list in its schedule's order: (forward?, micro-batch).
  std::vector<std::vector<std::pair<bool, int64_t>>> order(S);
  for (int s = 0; s < S; ++s) {
    if (schedule == train::Schedule::kGpipe) {
      for (int64_t m = 0; m < M; ++m) order[s].push_back({true, m});
      for (int64_t m = 0; m < M; ++m) order[s].push_back({false, m});
    } else {
      const int64_t warm = std::min<int64_t>(S - 1 - s, M);
      int64_t f = 0, b = 0;
      for (; f < warm; ++f) order[s].push_back({true, f});
      while (b < M) {
        if (f < M) order[s].push_back({true, f++});
        order[s].push_back({false, b++});
      }
    }
  }
  // fd[s][m], bd[s][m]: when stage s finished micro-batch m's forward / backward. Each device
  // runs its list in order, a step once its input arrived; resolved in rounds (a static
  // schedule, so this terminates).
  std::vector<std::vector<double>> fd(S, std::vector<double>(M, -1)), bd(S, std::vector<double>(M, -1));
  std::vector<size_t> next(S, 0);
  std::vector<Serial> dev(S);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      while (next[s] < order[s].size()) {
        const auto [fwd, m] = order[s][next[s]];
        double ready = 0;
        if (fwd && s > 0) {
          if (fd[s - 1][m] < 0) break;
          ready = arrive(s - 1, s, fd[s - 1][m]);
        } else if (!fwd) {
          if (fd[s][m] < 0) break;
          ready = fd[s][m];
          if (s < S - 1) {
            if (bd[s + 1][m] < 0) break;
            ready = std::max(ready, arrive(s + 1, s, bd[s + 1][m]));
          }
        }
        const double e = dev[s].book(ready, fwd ? dur_f[s] : dur_b[s]);
        (fwd ? fd : bd)[s][m] = e;
        next[s] += 1;
        progress = true;
      }
    }
  }
  for (int s = 0; s < S; ++s) PWM_CHECK(next[s] == order[s].size(), "pipeline schedule deadlocked at stage {}", s);
  PipelineTimes r;
  for (int s = 0; s < S; ++s) {
    r.end.push_back(dev[s].free_at);
    r.busy.push_back(dev[s].busy);
  }
  return r;
}

StepPrediction simulate_pipeline(const Cluster& c, const Profile& p, const train::TrainConfig& cfg, int S,
                                 train::Schedule schedule, MpmdModel model) {
  if (S < 1 || S > c.devices()) PWM_THROW("--stages {} needs 1..{} devices", S, c.devices());
  // The pipeline's program is chained: a cost per node and per step, a controller or none.
  const TrainerCosts tc = trainer_costs(p, ExecMode::kChained, model);
  const int per_host = (c.hosts_share_cores ? S : std::min(S, c.devices_per_host)) + tc.extra_procs;
  Ctx x(c, p, cfg, per_host);
  const int L = static_cast<int>(cfg.model.n_layers);
  const int64_t M = cfg.workload.microbatches, seqs = cfg.micro_batch();
  const double act_bytes = static_cast<double>(seqs * cfg.model.seq_len * cfg.model.d_model) * 4.0;
  const double exec = x.disp(tc.node_us);
  std::vector<double> dur_f(S), dur_b(S);
  for (int s = 0; s < S; ++s) {
    const int l0 = L * s / S, l1 = L * (s + 1) / S;
    // One node (kernel launch) per unit of the stage (programs::trace_pipeline_step traces the units).
    for (const Unit& u : x.plan.forward_units(0, l0, l1)) dur_f[s] += x.unit_us(u, seqs) + exec;
    for (const Unit& u : x.plan.backward_units(0, l0, l1)) dur_b[s] += x.unit_us(u, seqs) + exec;
  }
  const PipelineTimes pt = pipeline_times(dur_f, dur_b, M, schedule, [&](int from, int to, double t) {
    return message_arrival(c, from, to, act_bytes, t);
  });
  std::vector<Serial> dev(S);
  for (int s = 0; s < S; ++s) dev[s] = {pt.end[s], pt.busy[s]};
  // Updates: each stage its layers plus the tied embedding and final norm, after the tied
  // gradient came back to stage 0 and went out again.
  const double tied_bytes = static_cast<double>(x.plan.piece_size(model::StepPlan::kTiedPiece)) * 4.0;
  double t0 = dev[0].free_at;
  if (S > 1) t0 = std::max(t0, message_arrival(c, S - 1, 0, tied_bytes, dev[S - 1].free_at));
  double end = 0, busy = 0;
  for (int s = 0; s < S; ++s) {
    int64_t params = x.plan.piece_size(model::StepPlan::kTiedPiece);
    for (int l = L * s / S; l < L * (s + 1) / S; ++l) params += x.plan.piece_size(model::StepPlan::layer_piece(l));
    const double ready = s == 0 ? t0 : std::max(dev[s].free_at, message_arrival(c, 0, s, tied_bytes, t0));
    const double e = dev[s].book(ready, x.update_us(params) + exec);
    end = std::max(end, e);
    busy += dev[s].busy;
  }
  StepPrediction r;
  r.step_us = end + p.step_overhead_us + p.microbatch_overhead_us * static_cast<double>(M - 1) + x.disp(tc.step_us);
  r.compute_us = busy / S;
  r.bubble = 1.0 - (busy / S) / r.step_us;
  r.exposed_comm_us = r.step_us - r.compute_us;
  r.tokens_per_s = static_cast<double>(cfg.tokens_per_step()) / (r.step_us * 1e-6);
  return r;
}

}  // namespace pwm::sim
