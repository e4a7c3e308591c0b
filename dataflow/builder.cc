#include "dataflow/builder.h"

#include <fmt/format.h>

#include "common/check.h"

namespace pwm::dataflow {

Builder::Builder(std::string name, const KernelRegistry& registry)
    : def_(std::make_unique<ProgramDef>()), registry_(&registry) {
  def_->name = std::move(name);
}

const ProgramDef& Builder::def() const {
  PWM_CHECK(def_, "Builder used after build()");
  return *def_;
}

Value Builder::param(int slice, int num_shards, ArgSpec spec) {
  PWM_CHECK(def_, "Builder used after build()");
  const int i = def_->add_param(slice, num_shards, spec);
  return Value({-1, i}, std::move(spec), def_.get());
}

std::vector<Value> Builder::call(const std::string& kernel, int slice, int num_shards, const std::vector<Value>& inputs,
                                 std::vector<int64_t> attrs) {
  PWM_CHECK(def_, "Builder used after build()");
  std::vector<ValueId> ids;
  for (auto& v : inputs) {
    if (v.program() != def_.get() && def_->error.empty())
      def_->error = fmt::format("program '{}': a value of another program was passed to '{}'", def_->name, kernel);
    ids.push_back(v.id());
  }
  const int n = def_->add_call(*registry_, kernel, slice, num_shards, ids, std::move(attrs));
  std::vector<Value> out;
  const auto& specs = def_->nodes[n].out_specs;
  for (size_t o = 0; o < specs.size(); ++o) out.emplace_back(ValueId{n, static_cast<int>(o)}, specs[o], def_.get());
  return out;
}

void Builder::output(const Value& v) {
  PWM_CHECK(def_, "Builder used after build()");
  PWM_CHECK(v.program() == def_.get(), "output of a value of another program");
  def_->outputs.push_back(v.id());
}

ProgramDef Builder::build() {
  PWM_CHECK(def_, "Builder::build() called twice");
  ProgramDef d = std::move(*def_);
  def_.reset();
  return d;
}

}  // namespace pwm::dataflow
