// Internal: the controller behind Runtime and the client handles (runtime.h, client.h).
//
// Controller is the thread-safe front: the resource manager (its own lock), id allocation, the
// client table (its own lock), and the doorbell (doorbell.h) through which every command
// reaches the dispatcher thread (dispatcher.h), which owns the Channel to the workers, the run
// table, the object directory and the island schedulers; it is the only thread of rank 0 that
// calls MPI after start().
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pathways/client.h"
#include "pathways/doorbell.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/resource_manager.h"
#include "pathways/runtime.h"

namespace pwm::pathways {

struct SliceState {
  SliceInfo info;  // as allocated (devices: see Slice::devices() for the current ones)
  uint64_t owner = 0;
  std::weak_ptr<Controller> ctl;
  ~SliceState();
};

struct ArrayState {
  uint64_t id = 0;
  Slice slice;
  dataflow::ArgSpec spec;
  uint64_t owner = 0;
  FutureState<std::monostate> status;
  std::atomic<bool> awaited{false};  // a client waits for it (or fetches it): poll its run finely
  std::atomic<bool> released{false};  // Array::release()
  std::weak_ptr<Controller> ctl;
  ~ArrayState();  // frees the object on the workers
};

struct ProgramState {
  dataflow::ProgramDef def;
  std::vector<Slice> slices;  // keeps the slices alive
  std::weak_ptr<Controller> ctl;
  std::shared_ptr<dataflow::LoweredProgram> lowered;  // dispatcher thread only
  std::atomic<uint64_t> owner{0};           // the client that ran it first (0: never run)
  ~ProgramState();  // evicts the lowered program from the workers
};

struct ClientState {
  uint64_t id = 0;
  std::string name;
  std::shared_ptr<Controller> ctl;
  std::mutex mu;
  std::map<std::string, Program> opbyop;  // OpByOp programs by call signature
  double weight = 1;
  std::atomic<bool> closed{false};
  void disconnect();
  ~ClientState();  // disconnect(): frees every object the client owns
};

class Dispatcher;

class Controller : public std::enable_shared_from_this<Controller> {
 public:
  Controller(std::shared_ptr<collectives::Transport> t, RuntimeOptions o);
  ~Controller();

  void start();     // handshake with every worker, then starts the dispatcher thread
  void shutdown();  // blocks until every worker has left; idempotent
  std::vector<int> lost_workers() const;  // after shutdown(): Runtime::lost_workers

  ResourceManager& rm() { return *rm_; }
  uint64_t new_id() { return next_id_.fetch_add(1); }

  // Client entry points (any thread). They enqueue a command and return; after shutdown the
  // futures involved fail.
  void submit_run(std::shared_ptr<ProgramState> p, std::vector<std::shared_ptr<ArrayState>> in,
                  std::vector<std::shared_ptr<ArrayState>> out, RunOptions o, uint64_t run_id, uint64_t owner,
                  double weight);
  void usage(std::shared_ptr<FutureState<std::vector<ClientUsage>>> f);

  // The clients by id (any thread): names for messages and traces, and which are gone.
  void add_client(uint64_t id, const std::string& name, double weight);
  std::string client_name(uint64_t id) const;  // "'name' (client 7)"
  bool client_closed(uint64_t id) const;
  const RuntimeOptions& options() const { return opts_; }
  uint64_t memory_cap() const { return memory_cap_; }
  void submit_put(std::shared_ptr<ArrayState> a, std::vector<std::vector<uint8_t>> shards);
  void fetch(std::shared_ptr<ArrayState> a, std::shared_ptr<FutureState<HostTensor>> f);
  void stats(std::shared_ptr<FutureState<std::vector<WorkerStats>>> f);
  void drain(int device, bool undrain, std::shared_ptr<FutureState<std::monostate>> f);
  // A client started waiting: the dispatcher re-plans its sleep (it is woken unless it will wake
  // anyway before the devices run out of queued work: doorbell.h).
  void poke() { bell_.poke(); }
  // From handle destructors.
  void free_object(uint64_t id);
  void free_owner(uint64_t owner);  // the client disconnected
  void evict(std::shared_ptr<dataflow::LoweredProgram> lp);

  struct ClientRec {
    std::string name;
    double weight = 1;
    bool closed = false;
  };
  // A copy of the client table by id (any thread; for usage() and the trace's row names).
  std::map<uint64_t, ClientRec> clients() const;

 private:
  // Queues a command (doorbell.h). `wake`: wake the dispatcher now (a client is about to block
  // on the answer). False when the runtime is not accepting work.
  bool enqueue(Doorbell::Command c, bool wake = false) { return bell_.push(std::move(c), wake); }
  void thread_main();

  std::shared_ptr<collectives::Transport> t_;
  RuntimeOptions opts_;
  std::unique_ptr<ResourceManager> rm_;
  std::atomic<uint64_t> next_id_{1};
  std::unique_ptr<Dispatcher> d_;
  std::thread thread_;
  Doorbell bell_;            // the command queue and the dispatcher's wake-up state
  uint64_t memory_cap_ = 0;  // smallest worker cap (from the hellos)

  mutable std::mutex clients_mu_;
  std::map<uint64_t, ClientRec> clients_;
};

}  // namespace pwm::pathways
