// Profile and Cluster as JSON. Unknown keys are ignored; a missing required key is one error
// line naming the file and the key.
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "common/check.h"
#include "sim/sim.h"

namespace pwm::sim {

using nlohmann::json;

namespace {

json link_json(const Link& l) {
  json j = {{"latency_us", l.latency_us}, {"gbytes_per_s", l.gbytes_per_s}, {"overhead_us", l.overhead_us}};
  if (!l.gbytes_per_s_by_bytes.empty()) j["gbytes_per_s_by_bytes"] = l.gbytes_per_s_by_bytes;
  if (l.cpu_ns_per_byte > 0) j["cpu_ns_per_byte"] = l.cpu_ns_per_byte;
  return j;
}
Link link_from(const json& j, const Profile* p, const char* what) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (p != nullptr && s == "measured:intra") return p->intra;
    if (p != nullptr && s == "measured:inter") return p->inter;
    if (p != nullptr && s == "measured:inter_shaped") return p->inter_shaped;
    PWM_THROW("link '{}' of {}: expected an object or measured:intra|measured:inter|measured:inter_shaped", s, what);
  }
  Link l;
  l.latency_us = j.at("latency_us").get<double>();
  l.gbytes_per_s = j.at("gbytes_per_s").get<double>();
  l.overhead_us = j.value("overhead_us", 0.0);
  l.cpu_ns_per_byte = j.value("cpu_ns_per_byte", 0.0);
  if (!(l.gbytes_per_s > 0) || l.latency_us < 0 || l.cpu_ns_per_byte < 0)
    PWM_THROW("link {}: gbytes_per_s must be > 0, latency_us and cpu_ns_per_byte >= 0", what);
  for (const auto& e : j.value("gbytes_per_s_by_bytes", json::array())) {
    const double bytes = e.at(0), gbps = e.at(1);
    if (!(bytes > 0) || !(gbps > 0) ||
        (!l.gbytes_per_s_by_bytes.empty() && bytes <= l.gbytes_per_s_by_bytes.back().first))
      PWM_THROW("link {}: gbytes_per_s_by_bytes must be [bytes, GB/s] pairs, both > 0, bytes increasing", what);
    l.gbytes_per_s_by_bytes.emplace_back(bytes, gbps);
  }
  return l;
}
json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) PWM_THROW("cannot read the {} {}: give an existing JSON file", what, path);
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    PWM_THROW("the {} {} is not valid JSON: {}", what, path, e.what());
  }
}

}  // namespace

double Link::wire_us(double bytes) const {
  const auto& c = gbytes_per_s_by_bytes;
  double gbps = gbytes_per_s;
  if (!c.empty()) {
    if (bytes <= c.front().first) {
      gbps = c.front().second;
    } else if (bytes >= c.back().first) {
      gbps = c.back().second;
    } else {
      size_t i = 1;
      while (c[i].first < bytes) ++i;
      const double x = std::log(bytes / c[i - 1].first) / std::log(c[i].first / c[i - 1].first);
      gbps = c[i - 1].second + x * (c[i].second - c[i - 1].second);
    }
  }
  return bytes / (gbps * 1e3);
}

double Profile::contention_factor(int ranks) const {
  double f = 1.0;
  for (const auto& [r, x] : contention)
    if (r <= ranks) f = x;
  return f;
}

Profile::KernelRate Profile::rate_at(double tokens) const {
  if (rates.empty()) return {tokens, fwd_us_per_gflop, bwd_us_per_gflop};
  if (tokens <= rates.front().tokens) return {tokens, rates.front().fwd_us_per_gflop, rates.front().bwd_us_per_gflop};
  if (tokens >= rates.back().tokens) return {tokens, rates.back().fwd_us_per_gflop, rates.back().bwd_us_per_gflop};
  size_t i = 1;
  while (rates[i].tokens < tokens) ++i;
  const KernelRate& a = rates[i - 1];
  const KernelRate& b = rates[i];
  const double w = std::log(tokens / a.tokens) / std::log(b.tokens / a.tokens);
  return {tokens, a.fwd_us_per_gflop + w * (b.fwd_us_per_gflop - a.fwd_us_per_gflop),
          a.bwd_us_per_gflop + w * (b.bwd_us_per_gflop - a.bwd_us_per_gflop)};
}

json Profile::to_json() const {
  json c = json::array();
  for (const auto& [r, x] : contention) c.push_back({r, x});
  json rt = json::array();
  for (const KernelRate& k : rates) rt.push_back({{"tokens", k.tokens}, {"fwd_us_per_gflop", k.fwd_us_per_gflop}, {"bwd_us_per_gflop", k.bwd_us_per_gflop}});
  return {{"machine", machine},
          {"kernels",
           {{"fwd_us_per_gflop", fwd_us_per_gflop}, {"bwd_us_per_gflop", bwd_us_per_gflop}, {"opt_us_per_param", opt_us_per_param},
            {"step_overhead_us", step_overhead_us}, {"microbatch_overhead_us", microbatch_overhead_us},
            {"contention", c}, {"rates", rt}}},
          {"links",
           {{"reduce_ns_per_byte", reduce_ns_per_byte}, {"intra", link_json(intra)}, {"inter", link_json(inter)},
            {"inter_shaped", link_json(inter_shaped)}}},
          {"dispatch",
           {{"call_us", call_us}, {"node_us", node_us}, {"msg_us", msg_us}, {"exec_us", exec_us},
            {"spmd_exec_us", spmd_exec_us}, {"program_exec_us", program_exec_us}, {"fetch_rtt_us", fetch_rtt_us}, {"step_kernel_us", step_kernel_us},
            {"node_step_us", node_step_us},
            {"train_node_us", train_node_us}}}};
}

Profile Profile::from_json(const json& j) {
  Profile p;
  p.machine = j.value("machine", "");
  const json& k = j.at("kernels");
  p.fwd_us_per_gflop = k.at("fwd_us_per_gflop");
  p.bwd_us_per_gflop = k.at("bwd_us_per_gflop");
  p.opt_us_per_param = k.at("opt_us_per_param");
  p.step_overhead_us = k.at("step_overhead_us");
  p.microbatch_overhead_us = k.value("microbatch_overhead_us", 0.0);
  for (const auto& e : k.value("contention", json::array())) p.contention.push_back({e.at(0), e.at(1)});
  for (const auto& e : k.value("rates", json::array())) {
    const KernelRate r{e.at("tokens").get<double>(), e.at("fwd_us_per_gflop").get<double>(), e.at("bwd_us_per_gflop").get<double>()};
    if (!(r.tokens > 0) || !(r.fwd_us_per_gflop > 0) || !(r.bwd_us_per_gflop > 0))
      PWM_THROW("kernels.rates: tokens and both rates must be > 0 (regenerate the profile with mpi_scripts/sim_calibrate.sh)");
    if (!p.rates.empty() && !(r.tokens > p.rates.back().tokens))
      PWM_THROW("kernels.rates: list the sizes once each in increasing tokens");
    p.rates.push_back(r);
  }
  const json& l = j.at("links");
  p.reduce_ns_per_byte = l.at("reduce_ns_per_byte");
  p.intra = link_from(l.at("intra"), nullptr, "links.intra");
  p.inter = link_from(l.at("inter"), nullptr, "links.inter");
  p.inter_shaped = link_from(l.value("inter_shaped", l.at("inter")), nullptr, "links.inter_shaped");
  const json& d = j.at("dispatch");
  p.call_us = d.at("call_us");
  p.node_us = d.at("node_us");
  p.msg_us = d.at("msg_us");
  p.exec_us = d.at("exec_us");
  p.spmd_exec_us = d.at("spmd_exec_us");
  p.program_exec_us = d.value("program_exec_us", p.spmd_exec_us);  // profiles before it: one cost for both
  p.fetch_rtt_us = d.at("fetch_rtt_us");
  p.step_kernel_us = d.value("step_kernel_us", 0.0);
  p.node_step_us = d.value("node_step_us", 0.0);
  p.train_node_us = d.value("train_node_us", 0.0);
  return p;
}

Profile Profile::load(const std::string& path) {
  const json j = read_json(path, "profile");
  try {
    return from_json(j);
  } catch (const json::exception& e) {
    PWM_THROW("profile {}: {} (regenerate it with mpi_scripts/sim_calibrate.sh)", path, e.what());
  }
}

Cluster Cluster::from_json(const json& j, const Profile& p) {
  Cluster c;
  c.name = j.value("name", "");
  c.hosts = j.at("hosts");
  c.devices_per_host = j.at("devices_per_host");
  c.intra = link_from(j.at("intra"), &p, "intra");
  c.inter = link_from(j.at("inter"), &p, "inter");
  c.compute_scale = j.value("compute_scale", 1.0);
  if (j.contains("device_gflops")) {
    // A device of this many effective GFLOP/s against the profile's measured rate (its
    // forward and backward weighted 1:2, as a step's FLOPs are).
    const double us_per_gflop = (p.fwd_us_per_gflop + 2.0 * p.bwd_us_per_gflop) / 3.0;
    if (!(us_per_gflop > 0)) PWM_THROW("cluster {}: device_gflops needs a profile with measured kernels", c.name);
    c.compute_scale = j.at("device_gflops").get<double>() * us_per_gflop * 1e-6;
  }
  if (j.contains("controller_link")) {
    c.has_controller_link = true;
    c.controller_link = link_from(j.at("controller_link"), &p, "controller_link");
  }
  c.dispatch_scale = j.value("dispatch_scale", 1.0);
  c.cores_per_host = j.value("cores_per_host", 0);
  c.hosts_share_cores = j.value("hosts_share_cores", false);
  if (c.hosts < 1 || c.devices_per_host < 1 || !(c.compute_scale > 0) || !(c.dispatch_scale > 0))
    PWM_THROW("cluster {}: hosts and devices_per_host must be >= 1, the scales > 0", c.name);
  return c;
}

Cluster Cluster::load(const std::string& path, const Profile& p) {
  const json j = read_json(path, "cluster");
  try {
    return from_json(j, p);
  } catch (const json::exception& e) {
    PWM_THROW("cluster {}: {}", path, e.what());
  }
}

Cluster Cluster::local(const Profile& p, int devices) {
  Cluster c;
  c.name = "local";
  c.hosts = 1;
  c.devices_per_host = devices;
  c.intra = p.intra;
  c.inter = p.inter;
  c.cores_per_host = 2;
  return c;
}

}  // namespace pwm::sim
