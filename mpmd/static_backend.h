// mpmd_train's side of the one MPMD trainer: every rank runs the trainer over the static runtime
// (static_mpmd/static_runtime.h), each step reported when its own part is done, rank 0 writing
// the outputs, and the static order's figures (messages, receive waits, intermediates).
#pragma once

#include <memory>

#include "collectives/transport.h"
#include "mpmd/backend.h"
#include "static_mpmd/static_runtime.h"
#include "train/bootstrap.h"

namespace pwm::mpmd {

// What mpmd_train's start-up checks (train/bootstrap.h): every rank is a device of a slice.
train::TrainerSpec static_spec();

class StaticBackend final : public Backend {
 public:
  // On every rank, collectively.
  StaticBackend(const train::TrainConfig& cfg, std::shared_ptr<collectives::Transport> transport);
  Model model() const override { return Model::kStatic; }
  dataflow::Runtime& runtime() override { return rt_; }
  int steps_in_flight() const override { return 0; }
  bool writes_outputs() const override { return rank_ == 0; }
  int rank() const override { return rank_; }
  Trace* own_trace() override { return nullptr; }
  void report(train::TrainReport& r, const std::vector<int>& slices, const dataflow::Executable* step) override;
  std::vector<std::string> trace_fragments(const std::vector<dataflow::Array>& per_slice, int64_t words) override;

 private:
  int rank_;
  static_mpmd::StaticRuntime rt_;
};

}  // namespace pwm::mpmd
