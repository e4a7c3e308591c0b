// Chrome / Perfetto trace events (the JSON "Trace Event Format"), recorded per process and
// merged into one file with one process row per rank; ui.perfetto.dev and chrome://tracing open
// it. Recording is cheap (an append of the event's text) and off unless enabled.
//
// The text goes to pages mapped for the trace alone, never to malloc's heap: a run records
// thousands of small events that live to its end, and as heap blocks they sat between a
// kernel's large temporaries, so the heap could not reuse what those freed (a traced pipeline
// stage held 50-90 MiB more than an untraced one: docs/results/memory.md, "the trace's heap").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/atomic_file.h"  // write_file_atomic, check_output_path

namespace pwm {

class Trace {
 public:
  // Move-only: the recorded text is owned (its pages are unmapped with the Trace).
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
  // Bytes of recorded text (the events and their separators).
  size_t text_bytes() const { return text_bytes_; }

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
  struct Unmap {
    size_t bytes;
    void operator()(char* p) const;
  };
  struct Page {
    std::unique_ptr<char, Unmap> text;  // mmap'd; its deleter knows the size
    size_t used = 0;
  };
  void append(std::string_view event);  // (an event never spans two pages)

  bool enabled_;
  int pid_;
  int64_t origin_;
  std::vector<Page> pages_;
  size_t text_bytes_ = 0;
};

// Writes {"traceEvents": [fragments...], "displayTimeUnit": "ms"} to `path` through an
// AtomicFile (common/atomic_file.h): complete or absent. Throws pwm::Error with one line naming
// `what` and the path if the file cannot be written (a full disk included).
void write_trace_file(const std::string& path, const std::vector<std::string>& fragments,
                      const std::string& what = "trace");

}  // namespace pwm
