// Chrome / Perfetto trace events (the JSON "Trace Event Format"), recorded per process and
// merged into one file with one process row per rank; ui.perfetto.dev and chrome://tracing open
// it. Recording is cheap (an append to a vector) and off unless enabled.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/atomic_file.h"  // write_file_atomic, check_output_path

namespace pwm {

class Trace {
 public:
  // `pid` is the row (a rank); timestamps are microseconds since `origin_us` (now_us() taken at
  // a common start, e.g. right after a barrier, so that rows line up).
  Trace(bool enabled, int pid, int64_t origin_us);

  bool enabled() const { return enabled_; }
  // A complete event [start_us, end_us) in now_us() time on thread row `tid`.
  void span(const std::string& name, const char* category, int64_t start_us, int64_t end_us,
            int tid = 0, const std::string& args_json = "");
  // A counter track `name` (one series, `series`) taking `value` at ts_us.
  void counter(const std::string& name, const std::string& series, int64_t ts_us, double value);
  void process_name(const std::string& name);
  void thread_name(int tid, const std::string& name);

  // This process's events as a comma-separated JSON fragment (for merging).
  std::string fragment() const;

  // RAII span: records [construction, destruction).
  class Scope {
   public:
    Scope(Trace& t, const char* name, const char* category, int tid = 0);
    ~Scope();

   private:
    Trace& t_;
    const char* name_;
    const char* cat_;
    int tid_;
    int64_t start_;
  };

 private:
  bool enabled_;
  int pid_;
  int64_t origin_;
  std::vector<std::string> events_;
};

// Writes {"traceEvents": [fragments...], "displayTimeUnit": "ms"} to `path` through an
// AtomicFile (common/atomic_file.h): complete or absent. Throws pwm::Error with one line naming
// `what` and the path if the file cannot be written (a full disk included).
void write_trace_file(const std::string& path, const std::vector<std::string>& fragments,
                      const std::string& what = "trace");

}  // namespace pwm
