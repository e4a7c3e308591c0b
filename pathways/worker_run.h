// Internal to worker.cc: what the worker loop keeps per loaded program, per run and per object
// migration (docs/pathways.md, "Dispatch" and "Life of a buffer"). Used by the worker thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dataflow/interpreter.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/messages.h"
#include "pathways/object_store.h"

namespace pwm::pathways::worker_detail {

// A loaded program: its plan (dataflow/interpreter.h) and, per exec, how long it last ran here
// (s; 0: not yet), for the flush before a long kernel.
struct LoadedProgram {
  explicit LoadedProgram(dataflow::WorkerProgram p) : plan(std::move(p)), last_s(plan.p.execs.size(), 0.0) {}
  dataflow::Plan plan;
  mutable std::vector<double> last_s;
};

// A worker-local run flag: the run's client was freed while the run waited for memory (its
// outputs are not entered in the store).
constexpr uint8_t kRunOwnerGone = 0x80;
// A worker-local run flag: cancelled (CancelRun) while it waited for memory: it fails at once.
constexpr uint8_t kRunCancelled = 0x40;

// A run on this worker: its walk over the program's list (none when it failed before starting)
// and what the worker adds: the island order, the trace's post times, the time in kernels.
struct Run {
  RunHeader h;
  std::shared_ptr<const LoadedProgram> prog;
  std::optional<dataflow::Walk> walk;
  std::vector<uint64_t> order;               // per instruction: exec order number (kExec only)
  std::vector<double> posted_at;             // per instruction, when recording a trace: now_s() before post
  std::string error;                         // first error on this worker before its walk
  double kernel_s = 0;                       // summed kernel durations
  bool finished() const { return !walk || walk->finished(); }
  const std::string& first_error() const { return error.empty() && walk ? walk->error() : error; }
};

struct Move {
  bool out = false;
  uint64_t object = 0;
  ObjectPtr obj;
  int peer = 0, tag = 0;
  bool posted = false;
  collectives::Request req;
};

}  // namespace pwm::pathways::worker_detail
