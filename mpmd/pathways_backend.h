// pathways_train's side of the one MPMD trainer: the trainer on the single controller (world rank
// 0) over the Pathways client (pathways/client_runtime.h), two steps in flight, the controller's
// own trace row and the workers' object-store figures; and the controller's whole run.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/transport.h"
#include "mpmd/backend.h"
#include "pathways/client_runtime.h"
#include "train/bootstrap.h"

namespace pwm::mpmd {

// What pathways_train's start-up checks (train/bootstrap.h): world rank 0 is the controller, the
// others are the devices of the slices (dp x tp, times --stages, times --replicas) and the spares.
train::TrainerSpec pathways_spec();

class PathwaysBackend final : public Backend {
 public:
  // On the controller, over `client` (its runs: --sequential; a pipeline's in program order).
  PathwaysBackend(const train::TrainConfig& cfg, pathways::Client& client, int num_islands);
  Model model() const override { return Model::kPathways; }
  dataflow::Runtime& runtime() override { return rt_; }
  int steps_in_flight() const override { return 2; }
  bool writes_outputs() const override { return true; }
  int rank() const override { return 0; }
  Trace* own_trace() override { return &trace_; }
  void report(train::TrainReport& r, const std::vector<int>& slices, const dataflow::Executable* step) override;
  std::vector<std::string> trace_fragments(const std::vector<dataflow::Array>& per_slice, int64_t words) override;

 private:
  Trace trace_;  // (before rt_, which records in it)
  pathways::Client& client_;
  pathways::ClientRuntime rt_;
};

// The controller's whole run (world rank 0; the other ranks serve as workers, pathways::run_worker):
// the runtime over the workers (islands and liveness from `cfg`), the header line, the training,
// the runtime's shutdown. Blocks until the training ends. Returns "" or, when the run stopped at
// a non-finite step (--skip-nonfinite), the one line saying why, with the workers released: the
// caller prints it once and every rank exits non-zero. `lost` gets the workers lost on the way
// (--spare-workers), which the job's last agreement leaves out. `reshape`: this process's kernel
// shapes to a run with that many replicas, called when the run goes on with fewer replicas.
std::string run_controller(std::shared_ptr<collectives::Transport> transport, const train::TrainConfig& cfg, bool resume,
                           std::vector<int>* lost = nullptr, std::function<void(int)> reshape = {});

}  // namespace pwm::mpmd
