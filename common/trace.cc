#include "common/trace.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "common/time.h"

namespace pwm {

namespace {
std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}
}  // namespace

Trace::Trace(bool enabled, int pid, int64_t origin_us) : enabled_(enabled), pid_(pid), origin_(origin_us) {}

void Trace::span(const std::string& name, const char* category, int64_t start_us, int64_t end_us,
                 int tid, const std::string& args_json) {
  if (!enabled_) return;
  events_.push_back(fmt::format(R"({{"name":"{}","cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":{}{}}})",
                                escape(name), category, start_us - origin_, std::max<int64_t>(end_us - start_us, 0),
                                pid_, tid, args_json.empty() ? "" : ",\"args\":" + args_json));
}

void Trace::counter(const std::string& name, const std::string& series, int64_t ts_us, double value) {
  if (!enabled_) return;
  events_.push_back(fmt::format(R"({{"name":"{}","ph":"C","ts":{},"pid":{},"args":{{"{}":{}}}}})", escape(name),
                                ts_us - origin_, pid_, escape(series), value));
}

void Trace::process_name(const std::string& name) {
  if (!enabled_) return;
  events_.push_back(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"{}"}}}})", pid_, escape(name)));
  events_.push_back(fmt::format(R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})", pid_, pid_));
}

void Trace::thread_name(int tid, const std::string& name) {
  if (!enabled_) return;
  events_.push_back(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", pid_, tid, escape(name)));
}

std::string Trace::fragment() const {
  std::string out;
  for (size_t i = 0; i < events_.size(); ++i) {
    if (i) out += ",\n";
    out += events_[i];
  }
  return out;
}

Trace::Scope::Scope(Trace& t, const char* name, const char* category, int tid)
    : t_(t), name_(name), cat_(category), tid_(tid), start_(t.enabled() ? now_us() : 0) {}

Trace::Scope::~Scope() {
  if (t_.enabled()) t_.span(name_, cat_, start_, now_us(), tid_);
}

void write_trace_file(const std::string& path, const std::vector<std::string>& fragments, const std::string& what) {
  std::string doc = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  for (const auto& f : fragments) {
    if (f.empty()) continue;
    if (!first) doc += ",\n";
    doc += f;
    first = false;
  }
  doc += "\n]}\n";
  write_file_atomic(path, doc, what);
}

}  // namespace pwm
