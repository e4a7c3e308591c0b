// The Pathways client API (C++): slices, arrays (futures), programs, runs.
//
//   Runtime rt(env.transport());             // world rank 0 only; the workers call run_worker()
//   Client c = rt.client("trainer");
//   Slice s = c.allocate(2);                  // a virtual slice of 2 devices
//   Array x = c.put<float>(s, Sharding::kSplit, {4}, {1, 2, 3, 4});
//   Array y = c.call("allreduce_add", s, {x}, {1})[0];   // OpByOp: one program per call
//   ProgramBuilder b("chain");                            // Chained: a traced program
//   Value v = b.param_like(x);
//   for (int i = 0; i < 128; ++i) v = b.call("allreduce_add", s, {v}, {1})[0];
//   b.output(v);
//   Program p = b.build();
//   Array z = c.run(p, {x})[0];               // returns at once; z is a future
//   std::vector<float> host = z.get<float>(); // waits, then fetches the value to the client
//
// Blocking: run()/call()/put() return at once (the work is queued to the dispatcher thread);
// Array::wait()/get(), Future::get(), Client::allocate/stats/drain block the calling thread on a
// condition variable (never spinning). Errors of a run (a kernel that throws, an unknown
// kernel, a wrong shape, a missed deadline, a failed input) fail the run's output futures with
// one line saying what and where; the runtime keeps running. Only a request that cannot be
// expressed (more devices than exist, a bad mesh) throws pwm::Error at the call.
//
// Ownership: handles are shared (copies refer to the same object). An Array's buffers live on
// the workers of its slice until the last handle is dropped (then the controller frees them
// there); a Slice is released when the last handle, array or program using it is dropped; a
// Program's lowered form is cached on the workers until the Program is dropped. When a Client's
// last handle is dropped, every object it owns is freed.
//
// Threads: a Client is used by one thread at a time; several Clients may be used from several
// threads (all MPI traffic goes through the runtime's one dispatcher thread).
//
// Isolation (multi-tenancy): a Slice, an Array and a Program belong to the Client that created
// them (a Program: the first Client that runs it). Passing another client's handle to run(),
// call() or put(), or an Array after release(), or using a Client after disconnect(), throws
// pwm::Error at the call and queues nothing. The dispatcher and the workers check the owner of
// every input again. A Client that disconnects (disconnect(), or its last handle dropped, e.g.
// when its thread fails) has its objects freed on every worker, its lowered programs evicted and
// its runs not yet sent failed; runs already on the workers finish and are then dropped.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "dataflow/builder.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/worker_stats.h"

namespace pwm::pathways {

class Controller;

// A value that becomes available later, set once by the dispatcher thread.
template <typename T>
class FutureState {
 public:
  void set(T v) {
    {
      std::lock_guard<std::mutex> g(mu_);
      value_ = std::move(v);
      done_ = true;
    }
    cv_.notify_all();
  }
  void fail(std::string e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (done_) return;
      error_ = std::move(e);
      failed_ = done_ = true;
    }
    cv_.notify_all();
  }
  bool done() const {
    std::lock_guard<std::mutex> g(mu_);
    return done_;
  }
  bool failed() const {
    std::lock_guard<std::mutex> g(mu_);
    return failed_;
  }
  void wait() const {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done_; });
  }
  std::string error() const {
    std::lock_guard<std::mutex> g(mu_);
    return error_;
  }
  const T& get() const {  // waits; throws on failure
    wait();
    if (failed_) throw pwm::Error(error_);
    return value_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false, failed_ = false;
  std::string error_;
  T value_{};
};

template <typename T>
class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<FutureState<T>> s) : s_(std::move(s)) {}
  bool ready() const { return s_->done(); }  // complete, successfully or not
  void wait() const { s_->wait(); }          // blocks; does not throw
  bool ok() const { return s_->done() && !s_->failed(); }
  std::string error() const { return s_->error(); }
  const T& get() const { return s_->get(); }  // blocks; throws pwm::Error on failure

 private:
  std::shared_ptr<FutureState<T>> s_;
};

// A value fetched to the client: the logical tensor, row-major.
struct HostTensor {
  dataflow::TensorSpec spec;
  std::vector<uint8_t> bytes;
  template <typename T>
  std::vector<T> as() const {
    PWM_CHECK(collectives::dtype_of<T>() == spec.dtype, "fetched {} read as another type", spec.str());
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
};

struct SliceState;
struct ArrayState;
struct ProgramState;
struct ClientState;

class Slice {
 public:
  Slice() = default;
  int id() const;
  int size() const;
  int island() const;
  const std::vector<int>& mesh() const;
  std::vector<int> devices() const;  // the current physical devices (a drain changes them)
  // A device of it was lost with no spare to take its place (RuntimeOptions::survive_without_spare):
  // it cannot run anything again; the client goes on without it or ends.
  bool lost() const;
  bool valid() const { return s_ != nullptr; }

 private:
  friend class Client;
  friend class ProgramBuilder;
  friend class Array;
  std::shared_ptr<SliceState> s_;
};

class Array {
 public:
  Array() = default;
  uint64_t id() const;
  const Slice& slice() const;
  const dataflow::ArgSpec& spec() const;  // per-shard spec and sharding
  dataflow::TensorSpec logical() const;
  bool ready() const;            // complete (ok or failed); does not block
  void wait() const;             // blocks until complete; throws pwm::Error if it failed
  bool ok() const;               // complete and not failed
  std::string error() const;     // the failure, once failed
  // Fetches the whole logical value to the client (the one time tensor data passes through
  // the controller). Waits for the array first; fails if the array failed.
  Future<HostTensor> fetch() const;
  template <typename T>
  std::vector<T> get() const {
    return fetch().get().as<T>();
  }
  bool valid() const { return s_ != nullptr; }
  uint64_t owner() const;  // the id of the Client that created it
  // Frees the object on the workers now (a run already using it keeps it until the run ends).
  // Every copy of this handle becomes invalid: using it in a run, or fetching it, is an error.
  void release();
  bool released() const;

 private:
  friend class Client;
  friend class ProgramBuilder;
  friend class Controller;
  std::shared_ptr<ArrayState> s_;
};

// A value inside a program being built (dataflow/builder.h).
using dataflow::Value;

class Program {
 public:
  Program() = default;
  // A program traced with dataflow::Builder over slice indices: slice i of `def` is slices[i]
  // (the dataflow::Runtime interface's slices, pathways/client_runtime.h).
  static Program over(dataflow::ProgramDef def, const std::vector<Slice>& slices);
  const dataflow::ProgramDef& def() const;
  const std::string& error() const { return def().error; }  // "" when the program is well formed
  bool valid() const { return s_ != nullptr; }

 private:
  friend class ProgramBuilder;
  friend class Client;
  std::shared_ptr<ProgramState> s_;
};

// Traces a program (the paper's @pw.program). Errors (unknown kernel, wrong shapes) are
// recorded, not thrown: running the program fails its futures with the first one.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name);
  Value param(const Slice& slice, dataflow::ArgSpec spec);
  Value param_like(const Array& a) { return param(a.slice(), a.spec()); }
  // Calls `kernel` on every device of `slice`; inputs on other slices or with another sharding
  // are moved there (point-to-point, M shards to N). Returns the kernel's outputs.
  std::vector<Value> call(const std::string& kernel, const Slice& slice, const std::vector<Value>& inputs,
                          std::vector<int64_t> attrs = {});
  void output(const Value& v);
  Program build();

 private:
  dataflow::Builder b_;
  std::vector<Slice> slices_;  // kept alive by the program
};

// A tenant's share of the island schedulers (proportional-share policy; FIFO ignores it).
struct ClientOptions {
  double weight = 1;  // > 0
};

// What the runtime counted for one client (Runtime::usage()): runs and node-shards sent to the
// workers, runs completed, and the kernels' summed durations on every device, as the workers
// measured them.
struct ClientUsage {
  uint64_t id = 0;
  std::string name;
  double weight = 1;
  bool connected = true;
  uint64_t runs_dispatched = 0, runs_completed = 0;
  uint64_t node_shards = 0;  // kernel executions sent (one per node per device of its slice)
  uint64_t node_shards_completed = 0;  // those of completed runs
  double kernel_s = 0;       // summed kernel durations reported by the workers (completed runs)
  uint64_t fetches = 0;      // values fetched to the client (Array::fetch/get), each a round trip
  uint64_t puts = 0;         // values placed on workers by the client (Client::put)
};

struct RunOptions {
  bool sequential = false;  // node after node through the controller (the paper's baseline)
  double deadline_s = 0;    // > 0: fail the run's futures if it is not done within this time,
                            // naming the device and node it is stuck on
  // Each worker runs the program's kernels strictly in program order (its instruction list),
  // not as their inputs arrive: the order is the schedule (a pipeline's 1F1B); transfers still
  // progress meanwhile. The program order must be a valid execution order (a traced program's is).
  bool in_order = false;
  // Per input (or empty: none): donated. The caller gives the input up: it holds no other handle
  // to it and runs nothing more on it (handles it still has must only be dropped). Each worker
  // then drops the object from its store when the run takes it, so a kernel that can write over
  // it (dataflow::Signature::reuse) does, once the run has read it for the last time (JAX's
  // donate_argnums). The trainer's step donates its state (dataflow/runtime.h: ClientRuntime).
  std::vector<uint8_t> donate = {};
};

class Client {
 public:
  Client() = default;
  uint64_t id() const;
  // A virtual slice of `devices` devices (mesh: optional shape; island: -1 = any). Throws
  // pwm::Error when it cannot be satisfied. Blocks only on the resource manager's lock.
  Slice allocate(int devices, std::vector<int> mesh = {}, int island = -1);
  // Places a client value on `slice`: split along dimension 0, or replicated.
  Array put(const Slice& slice, dataflow::Sharding sharding, const dataflow::TensorSpec& logical, const void* data);
  template <typename T>
  Array put(const Slice& slice, dataflow::Sharding sharding, std::vector<int64_t> shape, const std::vector<T>& v) {
    dataflow::TensorSpec t{collectives::dtype_of<T>(), std::move(shape)};
    PWM_CHECK_EQ(static_cast<int64_t>(v.size()), t.elements());
    return put(slice, sharding, t, v.data());
  }
  // Runs a program on inputs (one per parameter, on the parameter's slice with its spec).
  // Returns the output arrays at once.
  std::vector<Array> run(const Program& p, const std::vector<Array>& inputs, RunOptions o = {});
  // OpByOp: one kernel call as its own program (built once per signature and cached in this
  // client, like a jit cache: the cached programs keep their slices until the client goes).
  std::vector<Array> call(const std::string& kernel, const Slice& slice, const std::vector<Array>& inputs,
                          std::vector<int64_t> attrs = {}, RunOptions o = {});
  // Blocks until every worker answered (after everything queued before it).
  std::vector<WorkerStats> stats();
  // What the runtime counted for this client so far (Runtime::usage's row), after everything
  // queued before it. Blocks on the dispatcher thread's answer.
  ClientUsage usage();
  // Drains a device: remaps its slices, migrates the objects on them (worker to worker), and
  // makes programs on them lower again. Blocks until the remap is done and the moves are queued.
  void drain(int device);
  void undrain(int device);
  std::string describe() const;  // devices and islands
  const std::string& name() const;
  double weight() const;
  // Reclaims everything this client owns now: its objects are freed on every worker, its
  // programs evicted, its runs not yet sent failed. Afterwards every call on it throws. Also
  // happens when the last handle of the Client is dropped. Idempotent.
  void disconnect();
  bool connected() const;

 private:
  friend class Runtime;
  void check_usable(const char* what) const;
  std::shared_ptr<ClientState> s_;
};

}  // namespace pwm::pathways
