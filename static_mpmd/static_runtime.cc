#include "static_mpmd/static_runtime.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/check.h"
#include "dataflow/builder.h"
#include "dataflow/lowering.h"

namespace pwm::static_mpmd {

using dataflow::Array;

namespace {

// Slice i's communicator's context is 1 + i * kSliceContextStride (the world's is 0; the ones
// between are its kernels' sub-groups', dataflow/kernel.h).
constexpr uint32_t kFirstSliceContext = 1;
constexpr int kChannel = collectives::kFirstFreeChannel;  // the transfers' two tag channels

struct StaticExecutable final : dataflow::Executable {
  StaticExecutable(dataflow::ProgramDef d, dataflow::WorkerProgram p) : def_(std::move(d)), plan(std::move(p)) {}
  const dataflow::ProgramDef& def() const override { return def_; }
  dataflow::ProgramDef def_;
  dataflow::Plan plan;
  mutable ExecutableStats stats;
};

const StaticExecutable& cast(const dataflow::Executable& e) {
  const auto* s = dynamic_cast<const StaticExecutable*>(&e);
  PWM_CHECK(s != nullptr, "program '{}' was not loaded by the static runtime", e.def().name);
  return *s;
}

Array wrap(int slice, dataflow::ArgSpec spec, dataflow::ObjectPtr b) { return Array(slice, std::move(spec), std::move(b)); }

}  // namespace

StaticRuntime::StaticRuntime(std::shared_ptr<collectives::Transport> transport, double timeout_s)
    : t_(transport), world_(collectives::Communicator::world(transport)), exec_(transport, timeout_s, kChannel) {}

StaticRuntime::~StaticRuntime() = default;

int StaticRuntime::allocate(int devices, std::vector<int>, int) {
  const int first = first_.empty() ? 0 : first_.back() + size_.back();
  if (first + devices > t_->size())
    PWM_THROW("the static model's slices need {} ranks, but the job has {}", first + devices, t_->size());
  first_.push_back(first);
  size_.push_back(devices);
  return static_cast<int>(first_.size()) - 1;
}

int StaticRuntime::slice_size(int slice) const { return size_.at(static_cast<size_t>(slice)); }

std::vector<int> StaticRuntime::devices(int slice) const {
  std::vector<int> d(static_cast<size_t>(slice_size(slice)));
  std::iota(d.begin(), d.end(), first_[static_cast<size_t>(slice)]);
  return d;
}

dataflow::ExecutablePtr StaticRuntime::load(dataflow::ProgramDef def) {
  const int slices = static_cast<int>(first_.size());
  const auto lookup = [&](int slice) {
    PWM_CHECK(slice >= 0 && slice < slices, "program '{}' names slice {} of {}", def.name, slice, slices);
    return dataflow::SliceMapping{devices(slice), kFirstSliceContext + static_cast<uint32_t>(slice) * dataflow::kSliceContextStride,
                                  0, 0};
  };
  dataflow::LoweredProgram lp = dataflow::lower(def, 0, lookup);
  auto it = lp.workers.find(t_->rank());
  dataflow::WorkerProgram mine;  // (a rank outside every slice of the program runs nothing)
  mine.name = def.name;
  if (it != lp.workers.end()) {
    mine = std::move(it->second);
  } else {
    const auto in = [&](int slice) {
      const std::vector<int> d = devices(slice);
      return std::find(d.begin(), d.end(), t_->rank()) != d.end();
    };
    for (const dataflow::ParamDef& p : def.params)
      PWM_CHECK(!in(p.slice), "program '{}': rank {} is on slice {} but the lowering gave it no part", def.name, t_->rank(), p.slice);
    for (const dataflow::NodeDef& n : def.nodes)
      PWM_CHECK(!in(n.slice), "program '{}': rank {} is on slice {} but the lowering gave it no part", def.name, t_->rank(), n.slice);
  }
  return std::make_shared<StaticExecutable>(std::move(def), std::move(mine));
}

std::vector<Array> StaticRuntime::execute(const dataflow::Executable& e, std::vector<Array> inputs,
                                          const std::string&) {
  const StaticExecutable& x = cast(e);
  const dataflow::ProgramDef& def = x.def();
  PWM_CHECK_EQ(inputs.size(), def.params.size());
  Shards in;
  for (size_t j = 0; j < inputs.size(); ++j)
    if (dataflow::ObjectPtr b = shard(inputs[j])) in[static_cast<uint32_t>(j)] = std::move(b);
  inputs.clear();  // (a donated input's last reference is the run's now)
  RunStats rs;
  Shards out = exec_.run(x.plan, std::move(in), &rs);
  ExecutableStats& st = x.stats;
  st.runs++;
  st.messages += rs.messages;
  st.recv_wait_ms.push_back(rs.recv_wait_s * 1e3);
  st.peak_intermediate_bytes = std::max(st.peak_intermediate_bytes, rs.peak_intermediate_bytes);
  std::vector<Array> v;
  for (size_t o = 0; o < def.outputs.size(); ++o) {
    auto it = out.find(static_cast<uint32_t>(o));
    v.push_back(wrap(def.value_slice(def.outputs[o]), def.value_spec(def.outputs[o]),
                     it == out.end() ? nullptr : it->second));
  }
  return v;
}

std::vector<Array> StaticRuntime::call(const std::string& kernel, int slice, const std::vector<Array>& inputs,
                                       std::vector<int64_t> attrs) {
  std::string key = fmt::format("{}@{}:{}", kernel, slice, fmt::join(attrs, ","));
  for (const Array& a : inputs) key += fmt::format("|{}@{}", a.spec().str(slice_size(a.slice())), a.slice());
  auto it = calls_.find(key);
  if (it == calls_.end()) {
    dataflow::Builder b(kernel);
    std::vector<dataflow::Value> in;
    for (const Array& a : inputs) in.push_back(b.param(a.slice(), slice_size(a.slice()), a.spec()));
    for (const dataflow::Value& v : b.call(kernel, slice, slice_size(slice), in, std::move(attrs))) b.output(v);
    it = calls_.emplace(key, load(b.build())).first;
  }
  return execute(*it->second, inputs, kernel);
}

Array StaticRuntime::put(int slice, dataflow::Sharding sharding, const dataflow::TensorSpec& logical, const void* data) {
  const int n = slice_size(slice), first = first_.at(static_cast<size_t>(slice));
  dataflow::ArgSpec spec{logical, sharding};
  if (sharding == dataflow::Sharding::kSplit) {
    PWM_CHECK(!logical.shape.empty() && logical.shape[0] % n == 0, "put: {} does not split {} ways", logical.str(), n);
    spec.shard.shape[0] /= n;
  }
  const int me = t_->rank() - first;
  if (me < 0 || me >= n) return wrap(slice, spec, nullptr);
  const size_t bytes = spec.shard.bytes();
  auto b = std::make_shared<dataflow::Object>(spec.shard);
  const size_t offset = sharding == dataflow::Sharding::kSplit ? bytes * static_cast<size_t>(me) : 0;
  if (bytes) std::memcpy(b->buf.data(), static_cast<const uint8_t*>(data) + offset, bytes);
  return wrap(slice, spec, std::move(b));
}

std::vector<dataflow::HostValue> StaticRuntime::fetch(const std::vector<Array>& arrays, const std::string&) {
  // One allgather of every rank's shards (zeros where it holds none), each padded to whole words.
  std::vector<size_t> off{0};
  for (const Array& a : arrays) off.push_back(off.back() + (a.spec().shard.bytes() + 3) / 4 * 4);
  std::vector<uint8_t> mine(off.back(), 0), all(off.back() * static_cast<size_t>(t_->size()));
  for (size_t i = 0; i < arrays.size(); ++i)
    if (dataflow::ObjectPtr b = shard(arrays[i])) {
      PWM_CHECK_EQ(b->buf.size(), arrays[i].spec().shard.bytes());
      std::memcpy(&mine[off[i]], b->buf.data(), b->buf.size());
    }
  world_.allgather(mine.data(), all.data(), off.back() / 4, collectives::DataType::kInt32);
  std::vector<dataflow::HostValue> out(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    const size_t bytes = arrays[i].spec().shard.bytes();
    std::vector<int> ranks = devices(arrays[i].slice());
    if (arrays[i].spec().sharding == dataflow::Sharding::kReplicated) ranks.resize(1);
    for (int r : ranks) {
      const uint8_t* p = &all[static_cast<size_t>(r) * off.back() + off[i]];
      out[i].bytes.insert(out[i].bytes.end(), p, p + bytes);
    }
  }
  return out;
}

const ExecutableStats& StaticRuntime::stats(const dataflow::Executable& e) { return cast(e).stats; }

dataflow::ObjectPtr StaticRuntime::shard(const Array& a) {
  return a.as<dataflow::Object>();
}

}  // namespace pwm::static_mpmd
