// The training step traced as a dataflow program, for any value type: trace_grads and trace_step
// call `call(kernel, inputs, attrs)` once per node, in the order both MPMD models run them.
//
// V is dataflow::Value when building a program (dataflow/builder.h: the static model; pathways'
// ProgramBuilder makes the same values), or a runtime's handle when each call runs at once
// (pathways' opbyop: Array). The definitions are in trace_impl.h; trace.cc instantiates them for
// dataflow::Value, and a model with another V includes trace_impl.h to instantiate its own.
// Nothing here blocks but `call`; no MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dataflow/builder.h"
#include "programs/step_io.h"

namespace pwm::programs {

// Adds a node of `kernel` on the program's slice `slice` (an index the caller maps onto its own
// slices: replica r, or replica r's pipeline stage s = r S + s). The traces of several slices
// (pipeline.h, replicas.h) call it.
using SliceCall = std::function<std::vector<dataflow::Value>(int slice, const std::string& kernel,
                                                             std::vector<dataflow::Value> in, std::vector<int64_t> attrs)>;

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
// the device holds at once (trace_impl.h, FsdpNodes).
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

}  // namespace pwm::programs
