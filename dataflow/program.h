// Programs: the dataflow-graph IR both MPMD models build and lower (docs/dataflow.md).
//
// A program is a list of parameters (each with its virtual slice and per-shard spec), a list of
// nodes in topological order (each a call of a registered kernel on a virtual slice, consuming
// earlier values), and a list of outputs. One node is one *sharded* computation: calling kernel
// B on the output of A over N shards is one node and one edge, not N x N. The shapes of every
// value are known when the node is added (static shapes), which is what lets lowering allocate
// every buffer and plan every transfer ahead of time.
//
// This header is plain data (no runtime handles), so lowering is testable in one process;
// pathways' client API (pathways/client.h) builds it through its ProgramBuilder, the static model
// through Builder (builder.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dataflow/kernel.h"

namespace pwm::dataflow {

// A value of a program: output `index` of node `node`, or parameter `index` when node == -1.
struct ValueId {
  int node = -1;
  int index = 0;
  bool operator==(const ValueId&) const = default;
  bool operator<(const ValueId& o) const { return node != o.node ? node < o.node : index < o.index; }
};

struct ParamDef {
  int slice = 0;       // virtual slice id
  int num_shards = 1;  // the slice's size
  ArgSpec spec;
};

struct NodeDef {
  std::string kernel;
  int slice = 0;
  int num_shards = 1;
  std::vector<int64_t> attrs;
  std::vector<ValueId> inputs;
  std::vector<ArgSpec> in_specs, out_specs;  // from the kernel's signature
  bool collectives = false;
};

struct ProgramDef {
  std::string name;
  std::vector<ParamDef> params;
  std::vector<NodeDef> nodes;
  std::vector<ValueId> outputs;
  std::string error;  // the first error met while building; running the program fails with it

  // Where a value lives: its slice, slice size and spec. Checks the id.
  int value_slice(ValueId v) const;
  int value_shards(ValueId v) const;
  const ArgSpec& value_spec(ValueId v) const;
  std::string describe_node(int n) const;  // "node 3 'add'"

  // Appends a call of `kernel` (looked up in `reg`) on a slice of `num_shards` devices. On an
  // error (unknown kernel, wrong number of inputs, an input whose logical dtype/shape differs
  // from what the kernel expects) sets `error` (if unset) and still appends the node, with no
  // outputs when the kernel is unknown. Returns the node index.
  int add_call(const KernelRegistry& reg, const std::string& kernel, int slice, int num_shards,
               std::vector<ValueId> inputs, std::vector<int64_t> attrs);
  int add_param(int slice, int num_shards, ArgSpec spec);
};

}  // namespace pwm::dataflow
