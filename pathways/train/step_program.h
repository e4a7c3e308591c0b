// The training step as Pathways programs, traced from the step plan (model/step_plan.h).
//
//   chained   trace_step over a ProgramBuilder: one program per step (built once, lowered once,
//             each run sends only ids and handles), dispatched at once;
//   opbyop    trace_step over Client::call: the same nodes, each its own program;
//   pipeline  pipeline_program: the plan partitioned by layer range over S dp x tp slices,
//             the stages' units in GPipe or 1F1B order (and R such pipelines with --replicas).
// (fused is one node, names("fused_step"), which executes the plan inside the kernel.)
// Only the controller calls these; nothing here blocks except what `call` does.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pathways/client.h"
#include "pathways/train/programs.h"
#include "train/modes.h"

namespace pwm::pathways::train {

using pwm::train::Granularity;
using pwm::train::Schedule;


// The chained step with --moe-routing controller: trace_step cut before every MoE layer's block
// forward (of every micro-batch) into programs built once. Segment k ends with the layer's
// moe_counts, which the controller fetches; segment k + 1 takes the matrix it puts back. run()
// dispatches the segments in order, each as soon as the previous one's counts are back (the
// paper's fallback for data-dependent shapes: the controller is on the critical path once per
// MoE layer and micro-batch). Blocks in `route` only.
struct SegmentedStep {
  static constexpr int kPut = -2;  // Source::seg of a matrix the controller put back (index: which)
  struct Source {
    int seg;       // < 0: the step's input `index` (kPut: the index-th routing matrix); else segment seg's output
    size_t index;
  };
  std::vector<Program> programs;
  std::vector<std::vector<Source>> inputs;        // per segment, one per parameter
  std::vector<std::vector<size_t>> counts_output;  // per segment but the last: its counts' outputs
  std::vector<Source> outputs;                    // the step's (StepOutputs)
  // put(counts, i): the i-th matrix of a cut from its counts (a round trip).
  using PutFn = std::function<Array(const Array& counts, size_t i)>;
  std::vector<Array> run(Client& client, const std::vector<Array>& inputs, const RunOptions& ro, const PutFn& put) const;
};
// `inputs`: the state, then (--expert-island) each experts' device's state, on `expert_slices`:
// a cut before the experts' calls of an MoE layer puts one matrix per experts' device.
SegmentedStep segmented_step(const Shapes& sh, const KernelNames& names, const Slice& slice, const State<Array>& st,
                             const std::vector<Slice>& expert_slices = {},
                             const std::vector<State<Array>>& expert_states = {});

// Replicas (cfg.mesh.replicas = slices.size() > 1): island r's dp x tp slice slices[r] runs its step
// (Granularity::kChained: the plan's units, one node each; kFused: one fused_grads node), its
// pieces are reduced inside the island (dp > 1), then each piece goes to the peer devices of the
// other islands (runtime transfers, posted as soon as the piece exists) and replica_add sums the
// islands' copies in island order on every island; replica_update applies the same update on
// every island. Outputs: each island's StepOutputs in island order.
// --fsdp: at fused one piece, the device's gradient shard (shard_grads); at chained the
// single-island chained step's nodes per island (gathers and reduce-scatters as nodes), each
// chunk exchanged as its layer's backward finishes it. fsdp_held (optional): Grads::fsdp_held.
Program replica_program(const Shapes& sh, const KernelNames& names, Granularity granularity,
                        const std::vector<Slice>& slices, const std::vector<State<Array>>& states,
                        int64_t* fsdp_held = nullptr);

// The pipeline's step over `slices`: cfg.mesh.replicas pipelines of S = sh.pipe().stages stages, replica
// r's stage s on slices[r S + s] (a dp x tp slice holding stage_layers(sh, s)). Each stage's layer
// pieces are summed over its dp group as soon as they are final (dp_reduce_start/_finish, or the
// blocking dp_allreduce with cfg.exec.overlap off), then over the replicas (replica_add, replica
// order). The program's outputs are each slice's StepOutputs in slice order.
Program pipeline_program(const Shapes& sh, const KernelNames& names, Schedule schedule,
                         const std::vector<Slice>& slices, const std::vector<State<Array>>& states);

}  // namespace pwm::pathways::train
