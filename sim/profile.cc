// Profile and Cluster as JSON. Unknown keys are ignored; a missing required key, a value of
// the wrong type or a file that is not JSON is one error line naming the file and the key (its
// dotted path, e.g. kernels.fwd_us_per_gflop), never nlohmann's own text.
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/check.h"
#include "common/paths.h"
#include "sim/sim.h"

namespace pwm::sim {

using nlohmann::json;

namespace {

// A profile or cluster description is a few kilobytes; anything far larger is the wrong file.
constexpr uintmax_t kMaxJsonBytes = 64u << 20;

// "kernels.fwd_us_per_gflop": the key's path for messages.
std::string key_path(const std::string& where, const std::string& key) { return where.empty() ? key : where + "." + key; }

// A short rendering of a JSON value for messages.
std::string shown(const json& v) {
  std::string t = v.dump();
  return t.size() > 40 ? t.substr(0, 37) + "..." : t;
}

const json& object(const json& v, const std::string& where) {
  if (!v.is_object()) PWM_THROW("{} must be a JSON object {{...}} (got {})", where.empty() ? "the top level" : where, shown(v));
  return v;
}

// obj[key], which must be there.
const json& need(const json& obj, const std::string& where, const char* key) {
  object(obj, where);
  const auto it = obj.find(key);
  if (it == obj.end()) PWM_THROW("missing key {}", key_path(where, key));
  return *it;
}

double as_number(const json& v, const std::string& name) {
  if (!v.is_number()) PWM_THROW("{} must be a number (got {})", name, shown(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) PWM_THROW("{} must be a finite number (got {})", name, shown(v));
  return x;
}

double number(const json& obj, const std::string& where, const char* key) {
  return as_number(need(obj, where, key), key_path(where, key));
}
double number_or(const json& obj, const std::string& where, const char* key, double fallback) {
  object(obj, where);
  return obj.contains(key) ? number(obj, where, key) : fallback;
}
int whole(const json& obj, const std::string& where, const char* key) {
  const json& v = need(obj, where, key);
  if (!v.is_number_integer()) PWM_THROW("{} must be a whole number (got {})", key_path(where, key), shown(v));
  const int64_t x = v.get<int64_t>();
  if (x < -(1 << 30) || x > (1 << 30)) PWM_THROW("{} is out of range (got {})", key_path(where, key), x);
  return static_cast<int>(x);
}
int whole_or(const json& obj, const std::string& where, const char* key, int fallback) {
  object(obj, where);
  return obj.contains(key) ? whole(obj, where, key) : fallback;
}
bool flag_or(const json& obj, const std::string& where, const char* key, bool fallback) {
  object(obj, where);
  if (!obj.contains(key)) return fallback;
  if (!obj[key].is_boolean()) PWM_THROW("{} must be true or false (got {})", key_path(where, key), shown(obj[key]));
  return obj[key].get<bool>();
}
std::string text_or(const json& obj, const std::string& where, const char* key) {
  object(obj, where);
  if (!obj.contains(key)) return "";
  if (!obj[key].is_string()) PWM_THROW("{} must be a string (got {})", key_path(where, key), shown(obj[key]));
  return obj[key].get<std::string>();
}
// obj[key] as an array (empty when absent).
json array_or(const json& obj, const std::string& where, const char* key) {
  object(obj, where);
  if (!obj.contains(key)) return json::array();
  if (!obj[key].is_array()) PWM_THROW("{} must be a JSON array [...] (got {})", key_path(where, key), shown(obj[key]));
  return obj[key];
}
// A [a, b] pair of numbers, element i of the array `name`.
std::pair<double, double> pair_of(const json& e, const std::string& name, size_t i) {
  const std::string at = fmt::format("{}[{}]", name, i);
  if (!e.is_array() || e.size() != 2) PWM_THROW("{} must be a pair [a, b] of numbers (got {})", at, shown(e));
  return {as_number(e[0], at + "[0]"), as_number(e[1], at + "[1]")};
}

json link_json(const Link& l) {
  json j = {{"latency_us", l.latency_us}, {"gbytes_per_s", l.gbytes_per_s}, {"overhead_us", l.overhead_us}};
  if (!l.gbytes_per_s_by_bytes.empty()) j["gbytes_per_s_by_bytes"] = l.gbytes_per_s_by_bytes;
  if (l.cpu_ns_per_byte > 0) j["cpu_ns_per_byte"] = l.cpu_ns_per_byte;
  return j;
}
Link link_from(const json& j, const Profile* p, const std::string& what) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (p != nullptr && s == "measured:intra") return p->intra;
    if (p != nullptr && s == "measured:inter") return p->inter;
    if (p != nullptr && s == "measured:inter_shaped") return p->inter_shaped;
    PWM_THROW("link '{}' of {}: expected an object or measured:intra|measured:inter|measured:inter_shaped", s, what);
  }
  Link l;
  l.latency_us = number(j, what, "latency_us");
  l.gbytes_per_s = number(j, what, "gbytes_per_s");
  l.overhead_us = number_or(j, what, "overhead_us", 0.0);
  l.cpu_ns_per_byte = number_or(j, what, "cpu_ns_per_byte", 0.0);
  if (!(l.gbytes_per_s > 0) || l.latency_us < 0 || l.cpu_ns_per_byte < 0)
    PWM_THROW("link {}: gbytes_per_s must be > 0, latency_us and cpu_ns_per_byte >= 0", what);
  const json by_bytes = array_or(j, what, "gbytes_per_s_by_bytes");
  for (size_t i = 0; i < by_bytes.size(); ++i) {
    const auto [bytes, gbps] = pair_of(by_bytes[i], key_path(what, "gbytes_per_s_by_bytes"), i);
    if (!(bytes > 0) || !(gbps > 0) ||
        (!l.gbytes_per_s_by_bytes.empty() && bytes <= l.gbytes_per_s_by_bytes.back().first))
      PWM_THROW("link {}: gbytes_per_s_by_bytes must be [bytes, GB/s] pairs, both > 0, bytes increasing", what);
    l.gbytes_per_s_by_bytes.emplace_back(bytes, gbps);
  }
  return l;
}
// The JSON file given by `flag`, checked before it is opened (a regular file of sane size: a
// FIFO would block, a directory or a huge file is the wrong path). A syntax error names the line
// and column, in the project's words.
json read_json(const std::string& path, const char* flag) {
  check_input_file(flag, path, kMaxJsonBytes);
  std::ifstream in(path);
  if (!in) PWM_THROW("{} {}: cannot open it; check the path and its permissions", flag, path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Where the parser stopped: parse again with exceptions for the byte offset only.
    size_t byte = 0;
    try {
      const json again = json::parse(text);  // (throws here: the parse above failed)
      (void)again;
    } catch (const json::parse_error& e) {
      byte = e.byte;
    }
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < byte && i < text.size(); ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
      PWM_THROW("{} {} is empty: give a JSON file", flag, path);
    PWM_THROW("{} {} is not valid JSON (line {}, column {}): fix the file or give another", flag, path, line, col);
  }
  return j;
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

namespace {

// Profile::rates at `tokens`: linear in log(tokens) between two measured sizes, the nearest outside.
Profile::KernelRate rate_in_tokens(const std::vector<Profile::KernelRate>& rates, double tokens) {
  if (tokens <= rates.front().tokens) return {tokens, rates.front().fwd_us_per_gflop, rates.front().bwd_us_per_gflop};
  if (tokens >= rates.back().tokens) return {tokens, rates.back().fwd_us_per_gflop, rates.back().bwd_us_per_gflop};
  size_t i = 1;
  while (rates[i].tokens < tokens) ++i;
  const Profile::KernelRate& a = rates[i - 1];
  const Profile::KernelRate& b = rates[i];
  const double w = std::log(tokens / a.tokens) / std::log(b.tokens / a.tokens);
  return {tokens, a.fwd_us_per_gflop + w * (b.fwd_us_per_gflop - a.fwd_us_per_gflop),
          a.bwd_us_per_gflop + w * (b.bwd_us_per_gflop - a.bwd_us_per_gflop)};
}

// Profile::width_scales at `d_model`: linear in log(d_model) between two widths, the nearest outside.
Profile::WidthScale scale_in_width(const std::vector<Profile::WidthScale>& ws, double d_model) {
  if (ws.empty() || !(d_model > 0)) return {d_model, 1.0, 1.0};
  if (d_model <= ws.front().d_model) return ws.front();
  if (d_model >= ws.back().d_model) return ws.back();
  size_t i = 1;
  while (ws[i].d_model < d_model) ++i;
  const Profile::WidthScale& a = ws[i - 1];
  const Profile::WidthScale& b = ws[i];
  const double w = std::log(d_model / a.d_model) / std::log(b.d_model / a.d_model);
  return {d_model, a.fwd + w * (b.fwd - a.fwd), a.bwd + w * (b.bwd - a.bwd)};
}

}  // namespace

Profile::KernelRate Profile::rate_at(double tokens, double d_model) const {
  const KernelRate r = rates.empty() ? KernelRate{tokens, fwd_us_per_gflop, bwd_us_per_gflop} : rate_in_tokens(rates, tokens);
  const WidthScale s = scale_in_width(width_scales, d_model);
  return {tokens, r.fwd_us_per_gflop * s.fwd, r.bwd_us_per_gflop * s.bwd};
}

json Profile::to_json() const {
  json c = json::array();
  for (const auto& [r, x] : contention) c.push_back({r, x});
  json rt = json::array();
  for (const KernelRate& k : rates) rt.push_back({{"tokens", k.tokens}, {"fwd_us_per_gflop", k.fwd_us_per_gflop}, {"bwd_us_per_gflop", k.bwd_us_per_gflop}});
  json ws = json::array();
  for (const WidthScale& w : width_scales) ws.push_back({{"d_model", w.d_model}, {"fwd", w.fwd}, {"bwd", w.bwd}});
  json j = {{"machine", machine},
            {"kernels",
             {{"fwd_us_per_gflop", fwd_us_per_gflop}, {"bwd_us_per_gflop", bwd_us_per_gflop}, {"opt_us_per_param", opt_us_per_param},
              {"step_overhead_us", step_overhead_us}, {"microbatch_overhead_us", microbatch_overhead_us},
              {"contention", c}, {"rates", rt}, {"width_scales", ws}}},
            {"links",
             {{"reduce_ns_per_byte", reduce_ns_per_byte}, {"intra", link_json(intra)}, {"inter", link_json(inter)},
              {"inter_shaped", link_json(inter_shaped)}}},
            {"dispatch",
             {{"call_us", call_us}, {"node_us", node_us}, {"msg_us", msg_us}, {"exec_us", exec_us},
              {"spmd_exec_us", spmd_exec_us}, {"program_exec_us", program_exec_us}, {"fetch_rtt_us", fetch_rtt_us}, {"step_kernel_us", step_kernel_us},
              {"node_step_us", node_step_us},
              {"train_node_us", train_node_us}, {"train_call_us", train_call_us}}}};
  if (mpmd_static)
    j["static"] = {{"node_us", mpmd_static->node_us}, {"step_us", mpmd_static->step_us}, {"exec_us", mpmd_static->exec_us},
                   {"run_us", mpmd_static->run_us}};
  return j;
}

Profile Profile::from_json(const json& j) {
  Profile p;
  p.machine = text_or(j, "", "machine");
  const json& k = need(j, "", "kernels");
  p.fwd_us_per_gflop = number(k, "kernels", "fwd_us_per_gflop");
  p.bwd_us_per_gflop = number(k, "kernels", "bwd_us_per_gflop");
  p.opt_us_per_param = number(k, "kernels", "opt_us_per_param");
  p.step_overhead_us = number(k, "kernels", "step_overhead_us");
  p.microbatch_overhead_us = number_or(k, "kernels", "microbatch_overhead_us", 0.0);
  const json contention = array_or(k, "kernels", "contention");
  for (size_t i = 0; i < contention.size(); ++i) {
    const auto [r, x] = pair_of(contention[i], "kernels.contention", i);
    p.contention.push_back({static_cast<int>(r), x});
  }
  const json rates = array_or(k, "kernels", "rates");
  for (size_t i = 0; i < rates.size(); ++i) {
    const std::string at = fmt::format("kernels.rates[{}]", i);
    const KernelRate r{number(rates[i], at, "tokens"), number(rates[i], at, "fwd_us_per_gflop"),
                       number(rates[i], at, "bwd_us_per_gflop")};
    if (!(r.tokens > 0) || !(r.fwd_us_per_gflop > 0) || !(r.bwd_us_per_gflop > 0))
      PWM_THROW("kernels.rates: tokens and both rates must be > 0 (regenerate the profile with mpi_scripts/sim_calibrate.sh)");
    if (!p.rates.empty() && !(r.tokens > p.rates.back().tokens))
      PWM_THROW("kernels.rates: list the sizes once each in increasing tokens");
    p.rates.push_back(r);
  }
  const json widths = array_or(k, "kernels", "width_scales");  // profiles before it: none (1 at every width)
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string at = fmt::format("kernels.width_scales[{}]", i);
    const WidthScale w{number(widths[i], at, "d_model"), number(widths[i], at, "fwd"), number(widths[i], at, "bwd")};
    if (!(w.d_model > 0) || !(w.fwd > 0) || !(w.bwd > 0))
      PWM_THROW("kernels.width_scales: d_model and both factors must be > 0 (regenerate the profile with mpi_scripts/sim_calibrate.sh)");
    if (!p.width_scales.empty() && !(w.d_model > p.width_scales.back().d_model))
      PWM_THROW("kernels.width_scales: list the widths once each in increasing d_model");
    p.width_scales.push_back(w);
  }
  const json& l = need(j, "", "links");
  p.reduce_ns_per_byte = number(l, "links", "reduce_ns_per_byte");
  p.intra = link_from(need(l, "links", "intra"), nullptr, "links.intra");
  p.inter = link_from(need(l, "links", "inter"), nullptr, "links.inter");
  p.inter_shaped = link_from(l.contains("inter_shaped") ? l["inter_shaped"] : l["inter"], nullptr,
                             l.contains("inter_shaped") ? "links.inter_shaped" : "links.inter");
  const json& d = need(j, "", "dispatch");
  p.call_us = number(d, "dispatch", "call_us");
  p.node_us = number(d, "dispatch", "node_us");
  p.msg_us = number(d, "dispatch", "msg_us");
  p.exec_us = number(d, "dispatch", "exec_us");
  p.spmd_exec_us = number(d, "dispatch", "spmd_exec_us");
  p.program_exec_us = number_or(d, "dispatch", "program_exec_us", p.spmd_exec_us);  // profiles before it: one cost for both
  p.fetch_rtt_us = number(d, "dispatch", "fetch_rtt_us");
  p.step_kernel_us = number_or(d, "dispatch", "step_kernel_us", 0.0);
  p.node_step_us = number_or(d, "dispatch", "node_step_us", 0.0);
  p.train_node_us = number_or(d, "dispatch", "train_node_us", 0.0);
  p.train_call_us = number_or(d, "dispatch", "train_call_us", 0.0);  // profiles before it: none
  if (j.contains("static")) {  // profiles calibrated before mpmd_train was measured have none
    const json& s = object(j["static"], "static");
    p.mpmd_static = StaticCosts{number(s, "static", "node_us"), number(s, "static", "step_us"), number(s, "static", "exec_us"),
                                number(s, "static", "run_us")};
    const StaticCosts& c = *p.mpmd_static;
    if (c.node_us < 0 || c.step_us < 0 || c.exec_us < 0 || c.run_us < 0)
      PWM_THROW("static.node_us, step_us, exec_us and run_us must be >= 0");
  }
  return p;
}

const Profile::StaticCosts& Profile::static_costs() const {
  if (!mpmd_static)
    PWM_THROW("the profile has no static section (mpmd_train's costs; calibrated before it was measured): "
              "rerun mpi_scripts/sim_calibrate.sh to simulate --mpmd static");
  return *mpmd_static;
}

Profile Profile::load(const std::string& path) {
  const json j = read_json(path, "--profile");
  try {
    return from_json(j);
  } catch (const Error& e) {
    PWM_THROW("--profile {}: {} (regenerate it with mpi_scripts/sim_calibrate.sh)", path, e.what());
  }
}

Cluster Cluster::from_json(const json& j, const Profile& p) {
  Cluster c;
  c.name = text_or(j, "", "name");
  c.hosts = whole(j, "", "hosts");
  c.devices_per_host = whole(j, "", "devices_per_host");
  c.intra = link_from(need(j, "", "intra"), &p, "intra");
  c.inter = link_from(need(j, "", "inter"), &p, "inter");
  c.compute_scale = number_or(j, "", "compute_scale", 1.0);
  if (j.contains("device_gflops")) {
    // A device of this many effective GFLOP/s against the profile's measured rate (its
    // forward and backward weighted 1:2, as a step's FLOPs are).
    const double us_per_gflop = (p.fwd_us_per_gflop + 2.0 * p.bwd_us_per_gflop) / 3.0;
    if (!(us_per_gflop > 0)) PWM_THROW("cluster {}: device_gflops needs a profile with measured kernels", c.name);
    c.compute_scale = number(j, "", "device_gflops") * us_per_gflop * 1e-6;
  }
  if (j.contains("controller_link")) {
    c.has_controller_link = true;
    c.controller_link = link_from(j.at("controller_link"), &p, "controller_link");
  }
  c.dispatch_scale = number_or(j, "", "dispatch_scale", 1.0);
  c.cores_per_host = whole_or(j, "", "cores_per_host", 0);
  c.hosts_share_cores = flag_or(j, "", "hosts_share_cores", false);
  if (c.hosts < 1 || c.devices_per_host < 1 || !(c.compute_scale > 0) || !(c.dispatch_scale > 0) || c.cores_per_host < 0)
    PWM_THROW("cluster {}: hosts and devices_per_host must be >= 1, the scales > 0, cores_per_host >= 0", c.name);
  if (static_cast<int64_t>(c.hosts) * c.devices_per_host > (1 << 20))
    PWM_THROW("cluster {}: {} hosts x {} devices is more than the simulator handles (at most 2^20 devices)", c.name,
              c.hosts, c.devices_per_host);
  return c;
}

Cluster Cluster::load(const std::string& path, const Profile& p) {
  const json j = read_json(path, "--cluster");
  try {
    return from_json(j, p);
  } catch (const Error& e) {
    PWM_THROW("--cluster {}: {}", path, e.what());
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
