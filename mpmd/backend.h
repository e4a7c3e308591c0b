// What the one MPMD trainer (mpmd/trainer.h) needs from its execution model beside the runtime
// interface (dataflow/runtime.h): the few things that truly differ between a single controller
// and the static model. Two small adapters implement it: PathwaysBackend (pathways_backend.h,
// world rank 0 of pathways_train) and StaticBackend (static_backend.h, every rank of mpmd_train).
#pragma once

#include <string>
#include <vector>

#include "common/trace.h"
#include "dataflow/runtime.h"
#include "train/report.h"

namespace pwm::mpmd {

enum class Model { kPathways, kStatic };
const char* name(Model m);  // "pathways", "static": the run's name starts with it

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Model model() const = 0;
  virtual dataflow::Runtime& runtime() = 0;
  // Steps dispatched beyond the oldest one not yet reported: a controller keeps two in flight
  // while it reads the statistics of the one before (mpmd/trainer.cc says why); the static model
  // reports each step when its own part is done (0).
  virtual int steps_in_flight() const = 0;
  // This process writes the metrics, the trace and the report's lines (the controller; rank 0).
  virtual bool writes_outputs() const = 0;
  // This process's world rank, for the run loop's kill hook (train/loop.h).
  virtual int rank() const = 0;
  // Rows of the trace from processes that run no kernel (the controller's dispatch and waits;
  // none in the static model), and the trace those rows are recorded in (null: none).
  virtual Trace* own_trace() = 0;
  // The runtime's own figures for the final report, per slice of `slices` (in order): the object
  // store's and the intermediates' high-water marks; the static model's messages and receive
  // waits of the step program `step` (null when the step is not one program). Every process that
  // runs the trainer calls it (collective in the static model).
  virtual void report(train::TrainReport& r, const std::vector<int>& slices, const dataflow::Executable* step) = 0;
  // Every device's trace fragment, in slice and device order, from the trace kernel's outputs
  // (one array per slice, `words` int64 per device: the fragment's length, then its bytes), on
  // every process that runs the trainer: fetched by a controller; gathered by their actual
  // lengths in the static model (a fetch would move every rank's whole fixed-size output).
  virtual std::vector<std::string> trace_fragments(const std::vector<dataflow::Array>& per_slice, int64_t words) = 0;
};

}  // namespace pwm::mpmd
