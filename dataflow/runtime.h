// The MPMD runtime interface: what a trainer needs from a runtime that runs dataflow programs
// (XLA IFRT's Client, cut to that): slices and their devices, programs loaded once and executed
// on arrays, outputs returned as arrays, values put on a slice and fetched back. Two runtimes
// implement it, and one trainer (mpmd/) runs on either:
//   pathways::ClientRuntime      a single controller's client (pathways/client_runtime.h):
//                                execute() returns at once, its arrays are futures;
//   static_mpmd::StaticRuntime   every rank runs its own part (static_mpmd/static_runtime.h):
//                                execute() returns when this rank's part of the program is done.
//
// Programs are traced with dataflow::Builder over the runtime's slice indices (allocate()'s
// returns), with Builder::param(slice, slice_size(slice), array.spec()) for each input array.
//
// Which processes call: a single controller's runtime is used by its one client process; the
// static runtime by every rank of the job, with the same calls in the same order (fetch() and
// put() are collective there). Blocking: execute() and call() never wait for a kernel on a
// controller (only on this rank's own part in the static model); fetch() and wait() block until
// the values exist and throw pwm::Error with the runtime's one line when they failed.
// Ownership: an Array is a shared handle; its buffers live until its last copy is dropped.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "dataflow/program.h"

namespace pwm::dataflow {

// An array of a runtime: which slice holds it, its per-shard spec and sharding, and the
// runtime's own handle (opaque above it; a static rank outside the slice holds none).
class Array {
 public:
  Array() = default;
  Array(int slice, ArgSpec spec, std::shared_ptr<void> impl)
      : slice_(slice), spec_(std::move(spec)), impl_(std::move(impl)) {}
  int slice() const { return slice_; }
  const ArgSpec& spec() const { return spec_; }
  bool valid() const { return slice_ >= 0; }
  // This is the last handle to the array (no copy of it is held anywhere): moved into
  // Runtime::execute, it is donated.
  bool last_handle() const { return impl_.use_count() == 1; }
  // The runtime's handle, as the type it made it (null where this process holds none).
  template <typename T>
  std::shared_ptr<T> as() const {
    return std::static_pointer_cast<T>(impl_);
  }

 private:
  int slice_ = -1;
  ArgSpec spec_;
  std::shared_ptr<void> impl_;
};

// A program loaded on a runtime (lowered, its instruction lists prepared), run any number of
// times. Dropping the last handle unloads it.
class Executable {
 public:
  virtual ~Executable() = default;
  virtual const ProgramDef& def() const = 0;
};
using ExecutablePtr = std::shared_ptr<const Executable>;

// A fetched value: the logical tensor's bytes (the shards in device order when split, one copy
// when replicated).
struct HostValue {
  std::vector<uint8_t> bytes;
  template <typename T>
  std::vector<T> as() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};

class Runtime {
 public:
  virtual ~Runtime() = default;

  // ---- Slices --------------------------------------------------------------------------------
  // A slice of `devices` devices (mesh: its shape; island: -1 = any); returns its index.
  // Throws pwm::Error when it cannot be placed.
  virtual int allocate(int devices, std::vector<int> mesh, int island) = 0;
  virtual int num_islands() const = 0;
  virtual int slice_size(int slice) const = 0;
  virtual int island(int slice) const = 0;
  // Its devices now (a recovery onto a spare changes them).
  virtual std::vector<int> devices(int slice) const = 0;
  // A device of it was lost with no spare to take its place: it runs nothing again.
  virtual bool lost(int slice) const { return false; }

  // ---- Programs ------------------------------------------------------------------------------
  virtual ExecutablePtr load(ProgramDef def) = 0;
  // Runs `e` on `inputs` (one per parameter, in order, each on its parameter's slice with its
  // spec); returns the outputs, in order. `what` names the run in traces and errors.
  // Donation (XLA's donate_argnums, by ownership): an input whose last handle the caller moves in
  // is the run's; a kernel that can write its output over it (dataflow::Signature::reuse) may,
  // once the input is read for the last time. An input the caller still holds is never written.
  virtual std::vector<Array> execute(const Executable& e, std::vector<Array> inputs, const std::string& what) = 0;
  // One kernel call as its own program (the runtime caches it per signature): op by op.
  virtual std::vector<Array> call(const std::string& kernel, int slice, const std::vector<Array>& inputs,
                                  std::vector<int64_t> attrs) = 0;

  // ---- Values --------------------------------------------------------------------------------
  // Places a host value on `slice` (split along dimension 0, or replicated).
  virtual Array put(int slice, Sharding sharding, const TensorSpec& logical, const void* data) = 0;
  // The logical values of `arrays`, in order (a controller: one round trip each; the static
  // model: one allgather for all).
  virtual std::vector<HostValue> fetch(const std::vector<Array>& arrays, const std::string& what) = 0;
  // Blocks until `a` exists (throws when it failed).
  virtual void wait(const Array& a) = 0;
  // Values the runtime put on the devices so far (a controller's round trips: put after fetch).
  virtual uint64_t puts() { return 0; }

  template <typename T>
  std::vector<T> get(const Array& a, const std::string& what) {
    return fetch({a}, what).at(0).as<T>();
  }
};

}  // namespace pwm::dataflow
