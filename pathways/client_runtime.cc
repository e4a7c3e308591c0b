#include "pathways/client_runtime.h"

#include <memory>

#include "common/check.h"
#include "common/time.h"

namespace pwm::pathways {

namespace {

struct ClientExecutable final : dataflow::Executable {
  ClientExecutable(dataflow::ProgramDef d, Program p) : def_(std::move(d)), program(std::move(p)) {}
  const dataflow::ProgramDef& def() const override { return def_; }
  dataflow::ProgramDef def_;  // over the runtime's slice indices
  Program program;            // over the client's slices
};

}  // namespace

ClientRuntime::ClientRuntime(Client& client, int num_islands, RunOptions ro, Trace* trace)
    : client_(client), num_islands_(num_islands), ro_(ro), trace_(trace) {}

int ClientRuntime::allocate(int devices, std::vector<int> mesh, int island) {
  slices_.push_back(client_.allocate(devices, std::move(mesh), island));
  return static_cast<int>(slices_.size()) - 1;
}

dataflow::ExecutablePtr ClientRuntime::load(dataflow::ProgramDef def) {
  Program p = Program::over(def, slices_);
  return std::make_shared<ClientExecutable>(std::move(def), std::move(p));
}

const Array& ClientRuntime::array(const dataflow::Array& a) {
  const auto p = a.as<Array>();
  PWM_CHECK(p != nullptr, "an array of slice {} that is not the Pathways client's", a.slice());
  return *p;
}

std::vector<Array> ClientRuntime::arrays(const std::vector<dataflow::Array>& in) const {
  std::vector<Array> v;
  v.reserve(in.size());
  for (const dataflow::Array& a : in) v.push_back(array(a));
  return v;
}

// The client's arrays as the interface's: on `slice`, or each on its output's slice of `def`.
std::vector<dataflow::Array> ClientRuntime::wrap(const std::vector<Array>& out, int slice,
                                                 const dataflow::ProgramDef* def) const {
  std::vector<dataflow::Array> v;
  v.reserve(out.size());
  for (size_t o = 0; o < out.size(); ++o)
    v.emplace_back(def ? def->value_slice(def->outputs[o]) : slice, out[o].spec(), std::make_shared<Array>(out[o]));
  return v;
}

std::vector<dataflow::Array> ClientRuntime::execute(const dataflow::Executable& e, std::vector<dataflow::Array> inputs,
                                                    const std::string& what) {
  const auto* x = dynamic_cast<const ClientExecutable*>(&e);
  PWM_CHECK(x != nullptr, "program '{}' was not loaded by the Pathways client", e.def().name);
  const int64_t t0 = now_us();
  // An input whose last handle the caller moved in is donated (dataflow/runtime.h).
  RunOptions o = ro_;
  o.donate.assign(inputs.size(), 0);
  for (size_t i = 0; i < inputs.size(); ++i) o.donate[i] = inputs[i].last_handle() ? 1 : 0;
  auto out = client_.run(x->program, arrays(inputs), o);
  inputs.clear();
  if (trace_) trace_->span("dispatch " + what, "dispatch", t0, now_us());
  return wrap(out, -1, &x->def());
}

std::vector<dataflow::Array> ClientRuntime::call(const std::string& kernel, int slice, const std::vector<dataflow::Array>& inputs,
                                                 std::vector<int64_t> attrs) {
  return wrap(client_.call(kernel, at(slice), arrays(inputs), std::move(attrs), ro_), slice, nullptr);
}

dataflow::Array ClientRuntime::put(int slice, dataflow::Sharding sharding, const dataflow::TensorSpec& logical,
                                   const void* data) {
  return wrap({client_.put(at(slice), sharding, logical, data)}, slice, nullptr)[0];
}

std::vector<dataflow::HostValue> ClientRuntime::fetch(const std::vector<dataflow::Array>& in, const std::string& what) {
  const int64_t t0 = now_us();
  std::vector<dataflow::HostValue> out;
  out.reserve(in.size());
  // One at a time, as the trainer always fetched: a failed fetch (a lost device) throws before
  // the next is asked for.
  for (const dataflow::Array& a : in) out.push_back({array(a).fetch().get().bytes});
  if (trace_) trace_->span("wait " + what, "wait", t0, now_us());
  return out;
}

void ClientRuntime::wait(const dataflow::Array& a) { array(a).wait(); }

uint64_t ClientRuntime::puts() { return client_.usage().puts; }

}  // namespace pwm::pathways
