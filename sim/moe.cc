#include "sim/moe.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "common/check.h"
#include "model/params.h"
#include "sim/collective.h"
#include "train/step.h"

namespace pwm::sim {

using model::Unit;
using model::UnitKind;
using train::MoeRouting;

MoeRows moe_rows(const model::Config& m, int64_t tokens, int ep, double imbalance) {
  if (!(imbalance >= 1.0 && imbalance <= ep))
    PWM_THROW("--moe-imbalance {} must be in [1, {}] (the busiest of {} expert-parallel devices over the mean)",
              imbalance, ep, ep);
  MoeRows r;
  const double E = static_cast<double>(m.experts), P = ep;
  const int64_t cap = m.expert_capacity(tokens);
  if (cap >= 0) {  // every expert computes cap rows from each routing group, padding included
    r.device = E * static_cast<double>(cap);
    r.per_peer = E / P * static_cast<double>(cap);
  } else {
    const double kn = static_cast<double>(m.top_k * tokens);
    r.device = imbalance * kn;
    r.per_peer = std::ceil(imbalance * kn / P);
  }
  return r;
}

double controller_round_trip_us(const Cluster& c, const Profile& p, const train::TrainConfig& cfg, int segment_nodes) {
  const double dp = cfg.mesh.dp, E = static_cast<double>(cfg.model.experts), ds = 1.0 / c.dispatch_scale;
  // The controller sits on host 0 (sim/dispatch.cc): its link to the farthest of the dp workers.
  const bool cross = cfg.mesh.dp > c.devices_per_host;
  const Link& l = c.has_controller_link ? c.controller_link : cross ? c.inter : c.intra;
  const double fetch = p.fetch_rtt_us * ds + dp * l.wire_us(8.0 * E);
  const double put_bytes = 8.0 * 2 * E;  // a device's counts to receive, then its own (Shapes::route_counts)
  const double put = p.msg_us * dp * ds + dp * l.wire_us(put_bytes);
  const double dispatch = (p.call_us + p.node_us * segment_nodes + p.msg_us * dp) * ds;
  return fetch + put + dispatch + l.overhead_us + l.latency_us;
}

namespace {

// What one step's simulation needs, built once.
struct MoeSim {
  const Cluster& c;
  const Profile& p;
  const train::TrainConfig& cfg;
  const model::Config& m;
  ExecMode mode;
  bool controller, dropless;
  int dp, ep;
  model::ParamLayout layout;  // device 0's: the dense parameters and its experts
  model::StepPlan plan;
  int64_t seqs, tokens;       // per micro-batch on one dp rank
  MoeRows rows;
  double slow = 1.0;          // compute slowdown (cluster scale, contention), as sim/step.cc
  std::vector<int> dp_devs, ep_devs, expert_devs;  // device 0's groups

  MoeSim(const Cluster& c_, const Profile& p_, const train::TrainConfig& cfg_, ExecMode mode_, const MoeOptions& o)
      : c(c_), p(p_), cfg(cfg_), m(cfg_.model), mode(mode_),
        controller(mode_ != ExecMode::kSpmd && cfg_.mpmd.routing(cfg_.model) == MoeRouting::kController),
        dropless(cfg_.model.capacity_factor == 0.0), dp(cfg_.mesh.dp), ep(cfg_.mesh.ep),
        layout(cfg_.model, 0, 1, 0, cfg_.mesh.ep), plan(layout, cfg_.workload.microbatches),
        seqs(cfg_.micro_batch()), tokens(cfg_.micro_batch() * cfg_.model.seq_len),
        rows(moe_rows(cfg_.model, tokens, cfg_.mesh.ep, o.imbalance)) {
    const bool pw = mode != ExecMode::kSpmd;
    const int per_host = (c.hosts_share_cores ? dp : std::min(dp, c.devices_per_host)) + (pw ? 1 : 0);
    slow = 1.0 / c.compute_scale;
    if (c.cores_per_host > 0 && per_host > 1) slow *= p.contention_factor(per_host);
    for (int i = 0; i < dp; ++i) dp_devs.push_back(i);
    for (int i = 0; i < ep; ++i) ep_devs.push_back(i);
    for (int i = 0; i < dp; i += ep) expert_devs.push_back(i);
  }

  double kernel_us(const UnitFlops& f, double at_tokens) const {
    const Profile::KernelRate r = p.rate_at(at_tokens, static_cast<double>(cfg.model.d_model));
    return slow * (f.fwd * 1e-9 * r.fwd_us_per_gflop + f.bwd * 1e-9 * r.bwd_us_per_gflop);
  }
  bool moe_block(const Unit& u) const {
    return (u.kind == UnitKind::kBlockForward || u.kind == UnitKind::kBlockBackward) && m.moe_layer(u.layer);
  }
  // A unit's kernel time; an MoE block: its dense part as a dense block's, plus the experts' rows.
  double unit_us(const Unit& u) const {
    if (!moe_block(u)) return kernel_us(unit_flops(m, plan, u, seqs), static_cast<double>(tokens));
    const model::LayerOffsets& lo = layout.layer(u.layer);
    const double dense = static_cast<double>(lo.expert_gate_up - lo.begin);
    const double attn = 4.0 * static_cast<double>(m.n_heads * m.head_dim * m.seq_len);
    const double expert = 6.0 * static_cast<double>(m.d_ff * m.d_model) * rows.device;
    const double fwd = (2.0 * dense + attn) * static_cast<double>(tokens) + expert;
    const UnitFlops f = u.kind == UnitKind::kBlockForward ? UnitFlops{fwd, 0} : UnitFlops{0, 2.0 * fwd};
    return kernel_us(f, static_cast<double>(tokens));
  }
  // moe_counts: the layer's norm and router over the micro-batch's tokens.
  double moe_counts_us() const {
    const double C = static_cast<double>(m.d_model), E = static_cast<double>(m.experts);
    return kernel_us({(2.0 * C * E + C) * static_cast<double>(tokens), 0}, static_cast<double>(tokens));
  }
  // Collectives whose ranks enter together last the same wherever they start: each size is
  // simulated once (a projection's groups have thousands of ranks).
  enum Group { kDp, kEp, kExperts };
  const std::vector<int>& group(Group g) const { return g == kDp ? dp_devs : g == kEp ? ep_devs : expert_devs; }
  double allreduce_us(Group g, size_t bytes, collectives::Algorithm a = collectives::Algorithm::kAuto) const {
    return times->get({0, g, dp, ep, bytes, static_cast<int>(a)},
                      [&] { return simulate_allreduce(c, p, group(g), bytes, a).end; });
  }
  double alltoall_us(size_t bytes) const {
    return times->get({1, kEp, dp, ep, bytes, 0}, [&] { return simulate_alltoall(c, p, ep_devs, bytes).end; });
  }
  CollectiveTimes own;
  CollectiveTimes* times = &own;

  double update_us() const { return slow * p.opt_us_per_param * static_cast<double>(layout.total()); }
  double node_cost() const { return mode == ExecMode::kChained ? (p.exec_us + p.train_node_us) / c.dispatch_scale : 0.0; }
};

// The nodes of each segment dispatched after a round trip (SegmentedStep): segment k + 1 runs
// from an MoE layer's block forward to the next moe_counts, the last one to the step's end (one
// AllReduce node per piece and the update).
std::vector<int> segment_nodes(const MoeSim& s) {
  std::vector<int> seg;
  for (const Unit& u : s.plan.units()) {
    if (s.moe_block(u) && u.kind == UnitKind::kBlockForward) {
      if (!seg.empty()) seg.back() += 1;  // the moe_counts that ends the previous one
      seg.push_back(0);
    }
    if (!seg.empty()) seg.back() += 1;
  }
  if (!seg.empty()) seg.back() += s.plan.num_pieces() + 1;
  return seg;
}

// The units of the whole step on one device: when each finish range was finished (last
// micro-batch) and when the last unit ended.
struct UnitsResult {
  std::map<int, double> finished_at;
  double end = 0;
};

UnitsResult run_units(const MoeSim& s, MoeStep& r) {
  const bool a2a = s.ep > 1;
  const size_t row_bytes = static_cast<size_t>(4 * s.m.d_model);
  const double rows_us = a2a ? s.alltoall_us(static_cast<size_t>(s.rows.per_peer) * row_bytes) : 0;
  const size_t count_bytes = static_cast<size_t>(8 * s.m.experts / s.ep);
  const double counts_us = a2a && s.dropless && !s.controller ? s.alltoall_us(count_bytes) : 0;
  r.layer.alltoall_fwd_us = r.layer.alltoall_bwd_us = 2 * rows_us;
  r.layer.counts_us = counts_us;
  const std::vector<int> segs = s.controller ? segment_nodes(s) : std::vector<int>{};
  const double node = s.node_cost();
  UnitsResult u;
  double t = 0;
  for (const Unit& x : s.plan.units()) {
    const bool fwd = x.kind == UnitKind::kBlockForward;
    if (s.moe_block(x) && fwd && s.controller) {  // moe_counts, then the devices wait for the controller
      const double k = s.moe_counts_us();
      r.layer.moe_counts_us = k;
      const double rt = controller_round_trip_us(s.c, s.p, s.cfg, segs.at(static_cast<size_t>(r.round_trips)));
      t += k + node + rt;
      r.step.compute_us += k;
      r.step.nodes += 1;
      r.round_trips += 1;
      r.round_trip_total_us += rt;
    }
    const double k = s.unit_us(x);
    t += k + node;
    r.step.compute_us += k;
    r.step.nodes += s.mode == ExecMode::kChained ? 1 : 0;
    if (s.moe_block(x) && a2a) {
      const double comm = 2 * rows_us + (fwd ? counts_us : 0.0);
      t += comm;
      r.alltoall_total_us += comm;
    }
    const int f = s.plan.finishes(x);
    if (f >= 0 && x.micro == s.cfg.workload.microbatches - 1) u.finished_at[f] = t;
  }
  if (r.round_trips > 0) r.layer.round_trip_us = r.round_trip_total_us / r.round_trips;
  u.end = t;
  return u;
}

// One chain of buckets (BucketedAllreduce over `devs`): each starts when its last range is
// finished (`ready(last_unit)`) and the previous bucket is done. Returns the last one's end.
double bucket_chain(const MoeSim& s, const std::vector<std::pair<int64_t, int64_t>>& ranges, MoeSim::Group g,
                    const std::function<double(int)>& ready, MoeStep& r) {
  double prev = 0;
  if (s.group(g).size() < 2) return prev;
  for (const BucketCut& b : cut_buckets(ranges, s.cfg.exec.bucket_bytes)) {
    prev = std::max(ready(b.last_unit), prev) + s.allreduce_us(g, static_cast<size_t>(b.end - b.begin) * 4);
    r.step.collectives += 1;
  }
  return prev;
}

// SPMD and fused: spmd_train's reducers (the dense ranges over dp, the experts' over the ranks
// holding the same experts), overlapping the backward when cfg.exec.overlap.
double reduce_buckets(const MoeSim& s, const UnitsResult& u, MoeStep& r) {
  const auto& order = s.plan.finish_order();
  train::ExpertSplit split;
  if (s.ep > 1) {
    split = train::split_experts(s.layout, order);
  } else {
    split.dense = order;
  }
  auto at = [&](int f) { return s.cfg.exec.overlap ? u.finished_at.at(f) : u.end; };
  const double dense = bucket_chain(s, split.dense, MoeSim::kDp, at, r);
  const double experts = bucket_chain(s, split.experts, MoeSim::kExperts, [&](int e) {
    for (size_t f = 0; f < split.expert_of.size(); ++f)
      if (split.expert_of[f] == e) return at(static_cast<int>(f));
    PWM_THROW("sim: no finish range holds expert range {}", e);
  }, r);
  return std::max({u.end, dense, experts});
}

// Chained: one dp_allreduce node per piece after the units, its dense part over dp, then its
// experts over their group.
double reduce_pieces(const MoeSim& s, const UnitsResult& u, MoeStep& r) {
  double t = u.end;
  for (int piece = 0; piece < s.plan.num_pieces(); ++piece) {
    t += s.node_cost();
    r.step.nodes += 1;
    int64_t dense = s.plan.piece_size(piece), experts = 0;
    const int l = piece - 1;
    if (piece != model::StepPlan::kTiedPiece && s.ep > 1 && s.m.moe_layer(l)) {
      const model::LayerOffsets& lo = s.layout.layer(l);
      experts = lo.end - lo.expert_gate_up;
      dense -= experts;
    }
    for (const auto& [n, g] : {std::pair{dense, MoeSim::kDp}, std::pair{experts, MoeSim::kExperts}}) {
      if (n == 0 || s.group(g).size() < 2) continue;
      t += s.allreduce_us(g, static_cast<size_t>(n) * 4);
      r.step.collectives += 1;
    }
  }
  return t;
}

void check_supported(const train::TrainConfig& cfg, ExecMode mode) {
  if (!cfg.model.moe()) PWM_THROW("sim: simulate_moe_step needs a Mixture-of-Experts model (--experts E)");
  if (cfg.mesh.replicas > 1 || cfg.mesh.tp > 1)
    PWM_THROW("pwm_sim simulates Mixture-of-Experts steps on one slice with tp 1: leave out --replicas and --tp "
              "(got replicas={} tp={})", cfg.mesh.replicas, cfg.mesh.tp);
  if (mode == ExecMode::kOpByOp)
    PWM_THROW("pwm_sim does not model Mixture-of-Experts steps under --granularity opbyop: use spmd, fused or chained");
  if (mode == ExecMode::kSpmd) return;
  const MoeRouting r = cfg.mpmd.routing(cfg.model);
  const bool dropless = cfg.model.capacity_factor == 0.0;
  if (r == MoeRouting::kStatic && dropless)
    PWM_THROW("--moe-routing static needs a capacity (--capacity-factor > 0); dropless: controller or worker");
  if (r != MoeRouting::kStatic && !dropless)
    PWM_THROW("--moe-routing {} routes dropless layers: set --capacity-factor 0 (or use static)", train::name(r));
  if (r == MoeRouting::kController && mode == ExecMode::kFused)
    PWM_THROW("--moe-routing controller needs --granularity chained: a fused step is one kernel");
}

}  // namespace

MoeStep simulate_moe_step(const Cluster& c, const Profile& p, const train::TrainConfig& cfg, ExecMode mode,
                          const MoeOptions& o) {
  check_supported(cfg, mode);
  if (cfg.mesh.dp > c.devices()) PWM_THROW("--dp {} needs {} devices, the cluster has {}", cfg.mesh.dp, cfg.mesh.dp, c.devices());
  MoeSim s(c, p, cfg, mode, o);
  if (o.times != nullptr) s.times = o.times;
  MoeStep r;
  const UnitsResult u = run_units(s, r);
  double comm_end = mode == ExecMode::kChained ? reduce_pieces(s, u, r) : reduce_buckets(s, u, r);
  // The global norm: with P > 1 the experts' part over the group first (spmd_train), then the
  // loss's float64 over dp; recursive doubling.
  for (const MoeSim::Group g : {MoeSim::kEp, MoeSim::kDp}) {
    if (s.group(g).size() < 2) continue;
    comm_end += s.allreduce_us(g, 8, collectives::Algorithm::kRecursiveDoubling);
    r.step.collectives += 1;
  }
  const double upd = s.update_us();
  r.step.nodes += mode == ExecMode::kChained ? 1 : 0;
  r.step.compute_us += upd;
  const double overhead = p.step_overhead_us + p.microbatch_overhead_us * static_cast<double>(cfg.workload.microbatches - 1);
  double step = comm_end + upd + s.node_cost() + overhead;
  if (mode != ExecMode::kSpmd) step += (mode == ExecMode::kFused ? p.step_kernel_us : p.node_step_us) / c.dispatch_scale;
  r.step.step_us = step;
  r.step.exposed_comm_us = step - r.step.compute_us - overhead;
  r.step.tokens_per_s = static_cast<double>(cfg.tokens_per_step()) / (step * 1e-6);
  return r;
}

}  // namespace pwm::sim
