#include "common/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "common/check.h"
#include "common/memory.h"
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

// Pages of 1 MiB (a traced run of the reference model records ~0.2 MB per rank), or one event's
// size when larger.
constexpr size_t kPageBytes = size_t{1} << 20;
}  // namespace

Trace::Trace(bool enabled, int pid, int64_t origin_us) : enabled_(enabled), pid_(pid), origin_(origin_us) {}

void Trace::Unmap::operator()(char* p) const { unmap_pages(p, bytes); }

void Trace::append(std::string_view event) {
  const std::string_view sep = text_bytes_ ? ",\n" : "";
  const size_t n = sep.size() + event.size();
  if (pages_.empty() || pages_.back().used + n > pages_.back().text.get_deleter().bytes) {
    const size_t bytes = std::max(kPageBytes, n);
    pages_.push_back(Page{std::unique_ptr<char, Unmap>(static_cast<char*>(map_pages(bytes)), Unmap{bytes}), 0});
  }
  Page& page = pages_.back();
  char* at = std::copy(sep.begin(), sep.end(), page.text.get() + page.used);
  std::copy(event.begin(), event.end(), at);
  page.used += n;
  text_bytes_ += n;
}

namespace {
// One event's text, formatted on the stack (no heap block outlives the call).
template <typename... Args>
fmt::memory_buffer text(fmt::format_string<Args...> f, Args&&... args) {
  fmt::memory_buffer b;
  fmt::format_to(std::back_inserter(b), f, std::forward<Args>(args)...);
  return b;
}
std::string_view view(const fmt::memory_buffer& b) { return {b.data(), b.size()}; }
}  // namespace

void Trace::span(const std::string& name, const char* category, int64_t start_us, int64_t end_us,
                 int tid, const std::string& args_json) {
  if (!enabled_) return;
  append(view(text(R"({{"name":"{}","cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":{}{}{}}})", escape(name),
                   category, start_us - origin_, std::max<int64_t>(end_us - start_us, 0), pid_, tid,
                   args_json.empty() ? "" : ",\"args\":", args_json)));
}

void Trace::counter(const std::string& name, const std::string& series, int64_t ts_us, double value) {
  if (!enabled_) return;
  append(view(text(R"({{"name":"{}","ph":"C","ts":{},"pid":{},"args":{{"{}":{}}}}})", escape(name),
                   ts_us - origin_, pid_, escape(series), value)));
}

void Trace::process_name(const std::string& name) {
  if (!enabled_) return;
  append(view(text(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":"{}"}}}})", pid_, escape(name))));
  append(view(text(R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})", pid_, pid_)));
}

void Trace::thread_name(int tid, const std::string& name) {
  if (!enabled_) return;
  append(view(text(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", pid_, tid,
                   escape(name))));
}

std::string Trace::fragment() const {
  std::string out;
  out.reserve(text_bytes_);
  for (const Page& p : pages_) out.append(p.text.get(), p.used);
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
