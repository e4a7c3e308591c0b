#include "dataflow/kernel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace pwm::dataflow {

int64_t TensorSpec::elements() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

size_t TensorSpec::bytes() const {
  return static_cast<size_t>(elements()) * collectives::dtype_size(dtype);
}

std::string TensorSpec::str() const {
  return fmt::format("{}[{}]", collectives::dtype_name(dtype), fmt::join(shape, ","));
}

const char* sharding_name(Sharding s) { return s == Sharding::kSplit ? "split" : "replicated"; }

TensorSpec ArgSpec::logical(int num_shards) const {
  TensorSpec t = shard;
  if (sharding == Sharding::kSplit) {
    PWM_CHECK(!t.shape.empty(), "a split tensor needs at least one dimension ({})", t.str());
    t.shape[0] *= num_shards;
  }
  return t;
}

std::string ArgSpec::str(int num_shards) const {
  if (sharding == Sharding::kReplicated) return fmt::format("{} replicated x{}", shard.str(), num_shards);
  return fmt::format("{} split x{} (logical {})", shard.str(), num_shards, logical(num_shards).str());
}

KernelContext::KernelContext(int shard, int num_shards, int world_rank, std::span<const int64_t> attrs,
                             std::vector<Buffer> inputs, std::vector<Buffer> outputs,
                             collectives::Communicator* comm, const std::string* kernel_name)
    : shard_(shard), num_shards_(num_shards), world_rank_(world_rank), attrs_(attrs),
      inputs_(std::move(inputs)), outputs_(std::move(outputs)), comm_(comm), name_(kernel_name) {}

void KernelContext::set_used(size_t i, uint64_t piece_bytes, std::vector<uint64_t> used) {
  const uint64_t size = outputs_.at(i).spec->bytes();
  PWM_CHECK(piece_bytes > 0 && size % piece_bytes == 0 && used.size() == size / piece_bytes,
            "kernel '{}': output {} of {} bytes is not {} pieces of {}", *name_, i, size, used.size(), piece_bytes);
  for (uint64_t u : used) PWM_CHECK(u <= piece_bytes, "kernel '{}': {} bytes used of a piece of {}", *name_, u, piece_bytes);
  used_.resize(outputs_.size());
  used_[i] = {piece_bytes, std::move(used)};
}

int64_t KernelContext::attr(size_t i) const {
  if (i >= attrs_.size())
    PWM_THROW("kernel '{}': attribute {} missing (the node has {})", *name_, i, attrs_.size());
  return attrs_[i];
}

collectives::Communicator& KernelContext::comm() {
  if (!comm_)
    PWM_THROW("kernel '{}' uses collectives but was registered with collectives = false", *name_);
  return *comm_;
}

void KernelContext::check_type(const Buffer& b, DataType want, const char* what, size_t i) const {
  if (b.spec->dtype != want)
    PWM_THROW("kernel '{}': {} {} is {}, read as {}", *name_, what, i, b.spec->str(),
              collectives::dtype_name(want));
}

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry r;
  return r;
}

void KernelRegistry::add(KernelDef def) {
  PWM_CHECK(def.fn && def.signature, "kernel '{}' needs a function and a signature", def.name);
  std::lock_guard<std::mutex> g(mu_);
  if (defs_.count(def.name)) PWM_THROW("kernel '{}' is registered twice", def.name);
  std::string n = def.name;
  defs_[n] = std::make_unique<KernelDef>(std::move(def));
}

void KernelRegistry::add(std::string name, Signature sig, KernelFn fn, bool collectives) {
  KernelDef d;
  d.name = std::move(name);
  d.collectives = collectives;
  d.signature = [sig](std::span<const int64_t>, int) { return sig; };
  d.fn = std::move(fn);
  add(std::move(d));
}

const KernelDef* KernelRegistry::find(const std::string& name) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = defs_.find(name);
  return it == defs_.end() ? nullptr : it->second.get();
}

std::vector<std::string> KernelRegistry::names() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::string> v;
  for (auto& [n, d] : defs_) v.push_back(n);
  return v;
}

}  // namespace pwm::dataflow
