// Builder: traces a program (program.h) on virtual slices named by id and size, the way both MPMD
// models build their programs (pathways' ProgramBuilder wraps it with the runtime's slices; the
// static model calls it on its fixed slices). Errors (unknown kernel, wrong shapes, a value of
// another program) are recorded in the definition, not thrown: lowering it throws the first one.
// Plain data: no runtime, no MPI; one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dataflow/program.h"

namespace pwm::dataflow {

// A value inside a program being built: its id, its per-shard spec and sharding, and the program
// it belongs to (a value passed to another program's builder is an error).
class Value {
 public:
  Value() = default;
  Value(ValueId id, ArgSpec spec, const void* program) : id_(id), spec_(std::move(spec)), program_(program) {}
  const ArgSpec& spec() const { return spec_; }
  ValueId id() const { return id_; }
  const void* program() const { return program_; }

 private:
  ValueId id_;
  ArgSpec spec_;
  const void* program_ = nullptr;
};

class Builder {
 public:
  explicit Builder(std::string name, const KernelRegistry& registry = KernelRegistry::global());
  Value param(int slice, int num_shards, ArgSpec spec);
  // Calls `kernel` on every device of the slice; inputs on other slices or with another
  // sharding are moved there when the program is lowered. Returns the kernel's outputs.
  std::vector<Value> call(const std::string& kernel, int slice, int num_shards, const std::vector<Value>& inputs,
                          std::vector<int64_t> attrs = {});
  void output(const Value& v);
  const ProgramDef& def() const;
  // The definition; the builder is empty afterwards (using it again is a program error).
  ProgramDef build();

 private:
  std::unique_ptr<ProgramDef> def_;  // its address names the program in its values
  const KernelRegistry* registry_;
};

}  // namespace pwm::dataflow
