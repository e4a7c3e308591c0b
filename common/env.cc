// The table of every PWM_* setting and its one parser (env.h).
#include "common/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"

namespace pwm {

namespace {

enum class Kind { kNumber, kInteger, kFlag, kText };

struct Setting {
  const char* name;
  Kind kind;
  double min, max;      // numbers and integers: the accepted range
  bool min_exclusive;   // min itself is refused (a timeout of 0)
  const char* expect;   // what it is, for the error line: "a number of seconds > 0 (...)"
  const char* example;  // a good value
  bool (*valid_text)(const std::string&) = nullptr;  // texts
};

bool scheduler_policy(const std::string& v) {
  if (v == "fifo" || v == "share") return true;
  if (v.rfind("share:", 0) != 0 || v.size() == 6) return false;
  for (size_t i = 6; i < v.size(); ++i)
    if (v[i] < '0' || v[i] > '9') return false;
  return std::strtoll(v.c_str() + 6, nullptr, 10) >= 1 && v.size() < 16;
}
bool any_text(const std::string&) { return true; }

constexpr double kBig = 1e15;

// Every PWM_* variable read by a program (scripts' own variables, such as PWM_MPI, are theirs).
const Setting kSettings[] = {
    // collectives (docs/collectives.md)
    {"PWM_COLL_TIMEOUT", Kind::kNumber, 0, 1e9, true,
     "a number of seconds > 0 (the collectives' watchdog and the Pathways liveness timeout)", "300"},
    {"PWM_COLL_DEBUG", Kind::kFlag, 0, 1, false, "0 or 1 (fingerprint every collective)", "1"},
    {"PWM_COLL_SEGMENT_BYTES", Kind::kInteger, 1, kBig, false,
     "a whole number of bytes >= 1 (the collectives' pipelining segment)", "262144"},
    {"PWM_COLL_ALPHA_US", Kind::kNumber, 0, kBig, false, "a number of microseconds >= 0 (cost model: per message)", "1"},
    {"PWM_COLL_BETA_NS_PER_B", Kind::kNumber, 0, kBig, false, "a number of nanoseconds >= 0 (cost model: per byte sent)",
     "0.5"},
    {"PWM_COLL_GAMMA_NS_PER_B", Kind::kNumber, 0, kBig, false,
     "a number of nanoseconds >= 0 (cost model: per byte reduced)", "0.2"},
    // model (docs/model.md)
    {"PWM_MODEL_THREADS", Kind::kInteger, 1, 1024, false, "a whole number of threads in [1, 1024] (GEMM threads)", "1"},
    // pathways (docs/pathways.md)
    {"PWM_PW_SCHEDULER", Kind::kText, 0, 0, false, "fifo, share or share:N with N >= 1 (the island scheduler)", "fifo",
     scheduler_policy},
    {"PWM_PW_ISLAND_ORDERING", Kind::kFlag, 0, 1, false, "0 or 1 (the island order; 0 shows the deadlock it prevents)",
     "1"},
    {"PWM_PW_MEMORY_CAP", Kind::kNumber, 0, 1e18, false, "a number of bytes >= 0 (per-worker object store cap; 0: none)",
     "1e9"},
    {"PWM_PW_BUFFER_CACHE_MB", Kind::kNumber, 0, 1e9, false, "a number of MiB >= 0 (freed buffers kept for reuse)",
     "1024"},
    {"PWM_PW_TRACE", Kind::kText, 0, 0, false, "a file name (the runtime's Perfetto trace)", "pw.json", any_text},
    {"PWM_PW_BACKOFF_US", Kind::kNumber, 0, 1e9, true, "a number of microseconds > 0 (the dispatcher's fine polling)",
     "200"},
    {"PWM_PW_BATCH_DIV", Kind::kNumber, 1, 1e6, false, "a number >= 1 (awaited completions taken in batches of 1/N)",
     "2"},
    {"PWM_PW_WORKER_BACKOFF_US", Kind::kNumber, 0, 1e9, true,
     "a number of microseconds > 0 (the workers' longest back-off while busy)", "100"},
};

const Setting& find(const char* name) {
  for (const Setting& s : kSettings)
    if (std::strcmp(s.name, name) == 0) return s;
  PWM_CHECK(false, "environment setting {} is not registered in common/env.cc", name);
  std::abort();  // not reached
}

std::string bad(const Setting& s, const char* value) {
  return fmt::format("{}={}: expected {}; unset it for the default, or set e.g. {}={}", s.name, value, s.expect, s.name,
                     s.example);
}

// Parses `value` as setting `s`; returns "" and sets *out, or the error line.
std::string parse(const Setting& s, const char* value, double* out) {
  if (s.kind == Kind::kText) {
    if (!s.valid_text(value)) return bad(s, value);
    return "";
  }
  if (s.kind == Kind::kFlag) {
    if (std::strcmp(value, "0") == 0 || std::strcmp(value, "1") == 0) {
      *out = value[0] == '1';
      return "";
    }
    return bad(s, value);
  }
  char* end = nullptr;
  errno = 0;
  const double d = s.kind == Kind::kInteger ? static_cast<double>(std::strtoll(value, &end, 10)) : std::strtod(value, &end);
  if (end == value || *end != '\0' || errno == ERANGE || !std::isfinite(d)) return bad(s, value);
  if (d < s.min || (s.min_exclusive && d == s.min) || d > s.max) return bad(s, value);
  *out = d;
  return "";
}

const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? nullptr : v;
}

}  // namespace

double env_double(const char* name, double fallback) {
  const Setting& s = find(name);
  const char* v = value_of(name);
  if (v == nullptr) return fallback;
  double d = 0;
  if (std::string e = parse(s, v, &d); !e.empty()) throw Error(e);
  return d;
}

int64_t env_int(const char* name, int64_t fallback) {
  return static_cast<int64_t>(env_double(name, static_cast<double>(fallback)));
}

std::string env_string(const char* name) {
  const Setting& s = find(name);
  PWM_CHECK(s.kind == Kind::kText, "{} is not a text setting", name);
  const char* v = value_of(name);
  if (v == nullptr) return "";
  double unused = 0;
  if (std::string e = parse(s, v, &unused); !e.empty()) throw Error(e);
  return v;
}

std::string check_environment() {
  for (const Setting& s : kSettings) {
    const char* v = value_of(s.name);
    double unused = 0;
    if (v != nullptr)
      if (std::string e = parse(s, v, &unused); !e.empty()) return e;
  }
  return "";
}

std::vector<std::pair<std::string, std::string>> settings_in_effect() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Setting& s : kSettings)
    if (const char* v = value_of(s.name)) out.emplace_back(s.name, v);
  return out;
}

std::string describe_settings_difference(const std::string& a, const std::string& b) {
  auto value = [](const std::string& lines, const char* name) -> std::string {
    const std::string key = std::string(name) + "=";
    for (size_t at = 0; at < lines.size();) {
      const size_t end = lines.find('\n', at);
      const std::string line = lines.substr(at, end == std::string::npos ? std::string::npos : end - at);
      if (line.rfind(key, 0) == 0) return line.substr(key.size());
      if (end == std::string::npos) break;
      at = end + 1;
    }
    return "(unset)";
  };
  std::string out;
  int shown = 0;
  for (const Setting& s : kSettings) {
    const std::string va = value(a, s.name), vb = value(b, s.name);
    if (va == vb || shown == 3) continue;
    out += fmt::format("{}{}={} vs {}", shown++ ? ", " : "", s.name, va, vb);
  }
  return out;
}

}  // namespace pwm
