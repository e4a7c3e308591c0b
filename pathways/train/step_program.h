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
#include "pathways/train/step_io.h"
#include "train/modes.h"

namespace pwm::pathways::train {

using pwm::train::Granularity;
using pwm::train::Schedule;

template <typename V>
using CallFn = std::function<std::vector<V>(const std::string& kernel, std::vector<V> in, std::vector<int64_t> attrs)>;
// --moe-routing controller: given an MoE layer's moe_counts output (every device's rows per
// expert), returns the matrix the layer's block_fwd takes (the controller fetched it and put it
// back). Empty: the layers route without the controller.
template <typename V>
using RouteFn = std::function<V(const V& counts)>;

// The plan's units on one dp x tp slice, one node each, then one dp AllReduce node per gradient
// piece and the update node. Returns the update's outputs (StepOutputs' order). V is Value
// (tracing) or Array (running).
// The plan's units alone (forward and backward of every micro-batch): the gradient pieces (not
// reduced) and the micro-batch losses. replica >= 0: island `replica` of the replicas (its batch
// nodes read that island's rows).
// --fsdp: the layers' pieces are their chunks (reduce-scattered over dp) and the tied piece is
// whole; fsdp_held is the most bytes of gathered weights (the tied pieces' for the whole step),
// full layer gradients, the tied piece's gradient and started chunks
// the device holds at once (step_program.cc, FsdpNodes).
// --expert-island: the experts' devices (one slice each) and their states; `call` runs a kernel
// on experts' device j. With one, an MoE layer's block is moe_send, expert_fwd on every experts'
// device, moe_combine, and its backward moe_bwd_send, expert_bwd, block_bwd_remote
// (island_kernels.cc); expert_pieces are each experts' device's pieces of the MoE layers, in
// layer order.
// --moe-routing controller: `route` gives the counts experts' device j's expert_fwd takes for a
// layer from the dense slice's counts for it (moe_send's output): the controller fetches them
// and puts them on the device, a round trip per layer, micro-batch and experts' device, instead
// of the edge from the dense slice (static and worker routing).
template <typename V>
struct ExpertIsland {
  std::vector<State<V>> states;  // per experts' device
  std::function<std::vector<V>(int j, const std::string& kernel, std::vector<V> in, std::vector<int64_t> attrs)> call;
  std::function<V(const V& counts, int j)> route;
};
template <typename V>
struct Grads {
  std::vector<V> pieces, losses;
  int64_t fsdp_held = 0;
  std::vector<std::vector<V>> expert_pieces;
};
template <typename V>
Grads<V> trace_grads(const Shapes& sh, const KernelNames& names, int tp, const State<V>& st, const CallFn<V>& call,
                     int replica, const RouteFn<V>& route = {}, const ExpertIsland<V>* island = nullptr);

// fsdp_held (optional): Grads::fsdp_held of the step's trace. With an island the step's outputs
// are the dense slice's StepOutputs, then each experts' device's next state: the update's norm
// takes the experts' devices' squared norms (expert_sqnorm), their update (expert_update) the
// update's loss and norm.
template <typename V>
std::vector<V> trace_step(const Shapes& sh, const KernelNames& names, int tp, const State<V>& st, const CallFn<V>& call,
                          const RouteFn<V>& route = {}, int64_t* fsdp_held = nullptr,
                          const ExpertIsland<V>* island = nullptr);

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
