#include "dataflow/program.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pwm::dataflow {

int ProgramDef::value_slice(ValueId v) const {
  if (v.node < 0) return params.at(v.index).slice;
  return nodes.at(v.node).slice;
}

int ProgramDef::value_shards(ValueId v) const {
  if (v.node < 0) return params.at(v.index).num_shards;
  return nodes.at(v.node).num_shards;
}

const ArgSpec& ProgramDef::value_spec(ValueId v) const {
  if (v.node < 0) return params.at(v.index).spec;
  return nodes.at(v.node).out_specs.at(v.index);
}

std::string ProgramDef::describe_node(int n) const {
  return fmt::format("node {} '{}'", n, nodes.at(n).kernel);
}

int ProgramDef::add_param(int slice, int num_shards, ArgSpec spec) {
  params.push_back({slice, num_shards, std::move(spec)});
  return static_cast<int>(params.size()) - 1;
}

int ProgramDef::add_call(const KernelRegistry& reg, const std::string& kernel, int slice,
                         int num_shards, std::vector<ValueId> inputs, std::vector<int64_t> attrs) {
  const int n = static_cast<int>(nodes.size());
  NodeDef node;
  node.kernel = kernel;
  node.slice = slice;
  node.num_shards = num_shards;
  node.attrs = std::move(attrs);
  node.inputs = std::move(inputs);
  auto fail = [&](const std::string& msg) {
    if (error.empty()) error = fmt::format("program '{}': {}", name, msg);
  };
  const KernelDef* def = reg.find(kernel);
  if (!def) {
    fail(fmt::format("node {}: unknown kernel '{}' (registered: {})", n, kernel, fmt::join(reg.names(), ", ")));
    nodes.push_back(std::move(node));
    return n;
  }
  Signature sig;
  try {
    sig = def->signature(node.attrs, num_shards);
  } catch (const std::exception& e) {
    fail(fmt::format("node {} '{}': signature: {}", n, kernel, e.what()));
    nodes.push_back(std::move(node));
    return n;
  }
  node.in_specs = sig.inputs;
  node.out_specs = sig.outputs;
  node.collectives = def->collectives;
  if (node.inputs.size() != sig.inputs.size()) {
    fail(fmt::format("node {} '{}': kernel takes {} input(s), got {}", n, kernel, sig.inputs.size(),
                     node.inputs.size()));
  } else {
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      if (v.node >= n || (v.node < 0 && v.index >= static_cast<int>(params.size())) ||
          (v.node >= 0 && v.index >= static_cast<int>(nodes[v.node].out_specs.size()))) {
        fail(fmt::format("node {} '{}': input {} is not a value of this program", n, kernel, i));
        continue;
      }
      const ArgSpec& have = value_spec(v);
      const int have_n = value_shards(v);
      const ArgSpec& want = sig.inputs[i];
      bool ok = have.shard.dtype == want.shard.dtype;
      if (ok && have.sharding == Sharding::kSplit && have.shard.shape.empty()) ok = false;
      if (ok && want.sharding == Sharding::kSplit && want.shard.shape.empty()) ok = false;
      if (ok) ok = have.logical(have_n) == want.logical(num_shards);
      if (ok && want.sharding == Sharding::kSplit && have.logical(have_n).shape[0] % num_shards != 0) ok = false;
      if (!ok)
        fail(fmt::format("node {} '{}': input {} has the wrong shape: the kernel expects {} but got {}", n,
                         kernel, i, want.str(num_shards), have.str(have_n)));
      else if (have.prefix && !want.prefix)  // (its sends carry the used prefix only)
        fail(fmt::format("node {} '{}': input {} needs every byte, but its value's writer sends a prefix "
                         "(ArgSpec::prefix)", n, kernel, i));
    }
  }
  nodes.push_back(std::move(node));
  return n;
}

}  // namespace pwm::dataflow
