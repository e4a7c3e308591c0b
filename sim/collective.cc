#include "sim/collective.h"

#include <algorithm>
#include <map>
#include <memory>
#include <queue>

#include "collectives/algorithms.h"
#include "collectives/cost_model.h"
#include "common/check.h"
#include "sim/engine.h"

namespace pwm::sim {

using collectives::Algorithm;
using collectives::Schedule;
using collectives::StepKind;

Algorithm auto_algorithm(size_t bytes, int n, size_t segment_bytes) {
  return collectives::CostModel::from_env().pick_allreduce(bytes, n, segment_bytes);
}

double message_arrival(const Cluster& c, int from, int to, double bytes, double t) {
  const Link& l = c.link(from, to);
  return t + l.overhead_us + l.wire_us(bytes) + l.latency_us;
}

namespace {

// Plays every rank's schedule over the cluster's links (the message model of collective.h):
// `scale` multiplies every step's bytes (float32 elements); fills res.done, res.end, res.messages.
void play(const Cluster& c, const Profile& p, const std::vector<int>& devices, const std::vector<Schedule>& sch,
          double scale, const std::vector<double>& start, CollectiveResult& res) {
  const int n = static_cast<int>(devices.size());
  // Per-step state.
  struct St {
    std::vector<int> waiting;                 // unmet dependencies
    std::vector<double> ready;                // max end of the dependencies met so far
    std::vector<double> end;
    std::vector<std::vector<uint32_t>> users; // steps depending on this one
    std::vector<uint32_t> ordinal;            // send/recv: index among the messages of its pair
  };
  std::vector<St> st(n);
  for (int r = 0; r < n; ++r) {
    const auto& steps = sch[r].steps();
    const auto& deps = sch[r].deps();
    St& s = st[r];
    s.waiting.assign(steps.size(), 0);
    s.ready.assign(steps.size(), start[r]);
    s.end.assign(steps.size(), -1);
    s.users.resize(steps.size());
    s.ordinal.assign(steps.size(), 0);
    std::map<std::pair<int, int>, uint32_t> next;  // (kind, peer) -> count
    for (uint32_t i = 0; i < steps.size(); ++i) {
      for (uint32_t d = steps[i].dep_begin; d < steps[i].dep_end; ++d) {
        if (deps[d] == Schedule::kNone) continue;
        s.waiting[i] += 1;
        s.users[deps[d]].push_back(i);
      }
      if (steps[i].kind == StepKind::kSend || steps[i].kind == StepKind::kRecv)
        s.ordinal[i] = next[{static_cast<int>(steps[i].kind), steps[i].peer}]++;
    }
  }
  // Message arrivals and posted receives, keyed by (from, to, ordinal).
  std::map<std::tuple<int, int, uint32_t>, double> arrived;
  std::map<std::tuple<int, int, uint32_t>, std::pair<uint32_t, double>> posted;  // -> (recv step, posted at)
  std::vector<Serial> port(n), nic(c.hosts), cpu(n);
  Engine eng;
  std::function<void(int, uint32_t)> start_step;
  auto finish = [&](int r, uint32_t i, double t) {
    st[r].end[i] = t;
    res.done[r] = std::max(res.done[r], t);
    for (uint32_t u : st[r].users[i]) {
      st[r].ready[u] = std::max(st[r].ready[u], t);
      if (--st[r].waiting[u] == 0) eng.at(st[r].ready[u], [&, r, u] { start_step(r, u); });
    }
  };
  start_step = [&](int r, uint32_t i) {
    const auto& step = sch[r].steps()[i];
    const double t = eng.now();
    const double b = static_cast<double>(step.count) * 4.0 * scale;
    switch (step.kind) {
      case StepKind::kSend: {
        const int from = devices[r], to = devices[step.peer];
        const bool cross = c.host_of(from) != c.host_of(to);
        const Link& l = c.link(from, to);
        // The CPU pays the overhead, the port (in-host) or the host's NIC (cross-host) the wire.
        const double t_cpu = cpu[r].book(t, l.overhead_us);
        Serial& wire = cross ? nic[c.host_of(from)] : port[r];
        const double t_sent = wire.book(t_cpu, l.wire_us(b));
        res.messages += 1;
        const auto key = std::make_tuple(r, step.peer, st[r].ordinal[i]);
        const double arrival = t_sent + l.latency_us;
        eng.at(t_sent, [&, r, i, t_sent] { finish(r, i, t_sent); });
        auto it = posted.find(key);
        if (it != posted.end()) {
          const auto [ri, at] = it->second;
          const int peer = step.peer;
          eng.at(std::max(at, arrival), [&, peer, ri] { finish(peer, ri, eng.now()); });
          posted.erase(it);
        } else {
          arrived[key] = arrival;
        }
        break;
      }
      case StepKind::kRecv: {
        const auto key = std::make_tuple(step.peer, r, st[r].ordinal[i]);
        auto it = arrived.find(key);
        if (it != arrived.end()) {
          const double at = std::max(t, it->second);
          arrived.erase(it);
          eng.at(at, [&, r, i] { finish(r, i, eng.now()); });
        } else {
          posted[key] = {i, t};
        }
        break;
      }
      case StepKind::kReduce:
      case StepKind::kCopy: {
        const double g = p.reduce_ns_per_byte * 1e-3 * b * (step.kind == StepKind::kCopy ? 0.5 : 1.0);
        const double e = cpu[r].book(t, g);
        eng.at(e, [&, r, i, e] { finish(r, i, e); });
        break;
      }
    }
  };
  for (int r = 0; r < n; ++r)
    for (uint32_t i = 0; i < st[r].waiting.size(); ++i)
      if (st[r].waiting[i] == 0) eng.at(start[r], [&, r, i] { start_step(r, i); });
  eng.run();
  for (int r = 0; r < n; ++r)
    for (double e : st[r].end) PWM_CHECK(e >= 0, "sim: a collective's schedule did not complete (unmatched message)");
  res.end = *std::max_element(res.done.begin(), res.done.end());
}

}  // namespace

CollectiveResult simulate_allreduce(const Cluster& c, const Profile& p, const std::vector<int>& devices,
                                    size_t bytes, Algorithm a, std::vector<double> start, size_t segment_bytes,
                                    size_t max_elems) {
  const int n = static_cast<int>(devices.size());
  PWM_CHECK(n >= 1);
  if (start.empty()) start.assign(n, 0.0);
  CollectiveResult res;
  res.algorithm = a == Algorithm::kAuto ? auto_algorithm(bytes, n, segment_bytes) : a;
  if (a == Algorithm::kMpi) res.algorithm = Algorithm::kRing;  // MPI's own: modelled as the ring
  res.done = start;
  if (n == 1) {
    res.end = start[0];
    return res;
  }
  // The schedules, built at a scaled-down size when the buffer is large.
  const size_t count = std::max<size_t>(bytes / 4, 1);
  const size_t sim_count = std::min(count, max_elems);
  const double scale = static_cast<double>(count) / static_cast<double>(sim_count);
  const size_t seg = std::max<size_t>(static_cast<size_t>(static_cast<double>(segment_bytes / 4) / scale), 1);
  auto pool = std::make_shared<collectives::ScratchPool>();
  std::vector<float> buf(sim_count);  // shared by every rank: the builders only take addresses
  std::vector<Schedule> sch;
  sch.reserve(n);
  for (int r = 0; r < n; ++r) {
    sch.emplace_back(collectives::DataType::kFloat32, collectives::ReduceOp::kSum, pool);
    switch (res.algorithm) {
      case Algorithm::kRing: collectives::algo::allreduce_ring(sch[r], r, n, buf.data(), buf.data(), sim_count, seg); break;
      case Algorithm::kHalvingDoubling:
        collectives::algo::allreduce_halving_doubling(sch[r], r, n, buf.data(), buf.data(), sim_count);
        break;
      default: collectives::algo::allreduce_recursive_doubling(sch[r], r, n, buf.data(), buf.data(), sim_count); break;
    }
  }
  play(c, p, devices, sch, scale, start, res);
  return res;
}

CollectiveResult simulate_alltoall(const Cluster& c, const Profile& p, const std::vector<int>& devices,
                                   size_t bytes_per_peer, Algorithm a, std::vector<double> start, size_t max_elems) {
  const int n = static_cast<int>(devices.size());
  PWM_CHECK(n >= 1);
  collectives::check_algorithm(collectives::AlgorithmOp::kAlltoall, a);
  if (start.empty()) start.assign(n, 0.0);
  CollectiveResult res;
  res.algorithm = a == Algorithm::kAuto ? collectives::CostModel::from_env().pick_alltoall(bytes_per_peer, n) : a;
  if (a == Algorithm::kMpi) res.algorithm = Algorithm::kPairwise;  // MPI's own: modelled as pairwise
  res.done = start;
  res.end = *std::max_element(start.begin(), start.end());
  if (n == 1 || bytes_per_peer == 0) return res;
  // The schedules, built at a scaled-down size when the blocks are large (n blocks per buffer).
  const size_t count = std::max<size_t>(bytes_per_peer / 4, 1);
  const size_t sim_count = std::min(count, std::max<size_t>(max_elems / n, 1));
  const double scale = static_cast<double>(count) / static_cast<double>(sim_count);
  auto pool = std::make_shared<collectives::ScratchPool>();
  std::vector<float> send(sim_count * n), recv(sim_count * n);  // shared: the builders only take addresses
  const std::vector<size_t> counts(n, sim_count);
  std::vector<Schedule> sch;
  sch.reserve(n);
  for (int r = 0; r < n; ++r) {
    sch.emplace_back(collectives::DataType::kFloat32, collectives::ReduceOp::kSum, pool);
    switch (res.algorithm) {
      case Algorithm::kBruck: collectives::algo::alltoall_bruck(sch[r], r, n, send.data(), recv.data(), sim_count); break;
      case Algorithm::kLinear:
        collectives::algo::alltoallv_linear(sch[r], r, n, send.data(), counts, recv.data(), counts);
        break;
      default: collectives::algo::alltoallv_pairwise(sch[r], r, n, send.data(), counts, recv.data(), counts); break;
    }
  }
  play(c, p, devices, sch, scale, start, res);
  return res;
}

}  // namespace pwm::sim
