// The chained step with --moe-routing controller: trace_step cut before every MoE layer's block
// forward (of every micro-batch) into programs built and loaded once. Segment k ends with the
// layer's moe_counts, which the trainer fetches; segment k + 1 takes the matrix it puts back.
// run() executes the segments in order, each as soon as the previous one's counts are back (the
// paper's fallback for data-dependent shapes: the controller is on the critical path once per MoE
// layer and micro-batch). Blocks in `put` only.
#pragma once

#include <functional>
#include <vector>

#include "dataflow/runtime.h"
#include "programs/step_io.h"

namespace pwm::mpmd {

using dataflow::Array;

struct SegmentedStep {
  static constexpr int kPut = -2;  // Source::seg of a matrix the controller put back (index: which)
  struct Source {
    int seg;       // < 0: the step's input `index` (kPut: the index-th routing matrix); else segment seg's output
    size_t index;
  };
  std::vector<dataflow::ExecutablePtr> programs;
  std::vector<std::vector<Source>> inputs;         // per segment, one per parameter
  std::vector<std::vector<size_t>> counts_output;  // per segment but the last: its counts' outputs
  std::vector<Source> outputs;                     // the step's (StepOutputs)
  // put(counts, i): the i-th matrix of a cut from its counts (a round trip).
  using PutFn = std::function<Array(const Array& counts, size_t i)>;
  // Runs the segments. Each array is handed to its last reader's program by move, and dropped by
  // run() then: with the caller's last handles moved in (Trainer::donated_state), the last
  // segment's update writes the next state over this one, and a segment's outputs (the saved
  // activations, the gradient pieces) are freed where a single chained program would free them,
  // not when the step ends (dataflow/runtime.h: donation).
  std::vector<Array> run(dataflow::Runtime& rt, std::vector<Array> inputs, const PutFn& put) const;
};

// `st` on `slice`, then (--expert-island) each experts' device's state, on `expert_slices`: a cut
// before the experts' calls of an MoE layer puts one matrix per experts' device.
SegmentedStep segmented_step(dataflow::Runtime& rt, const programs::Shapes& sh, const programs::KernelNames& names,
                             int slice, const programs::State<Array>& st, const std::vector<int>& expert_slices = {},
                             const std::vector<programs::State<Array>>& expert_states = {});

}  // namespace pwm::mpmd
