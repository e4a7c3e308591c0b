// The static model's runtime (dataflow/runtime.h) over the Executor: every rank of the job holds
// one, makes the same calls in the same order, and runs its own part of each program. No
// controller: a slice is a fixed block of world ranks (slice i of d devices is ranks
// [first, first + d) in allocation order), an array is this rank's shard (none outside its
// slice), execute() returns when this rank's part is done, fetch() is collective over the world
// (an allgather of every rank's shards) and put() sends nothing (every rank holds the value).
//
// Which ranks call: every world rank, collectively, for every method but the slice queries.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dataflow/runtime.h"
#include "static_mpmd/executor.h"

namespace pwm::static_mpmd {

// What this rank measured over the runs of one executable.
struct ExecutableStats {
  uint64_t runs = 0, messages = 0;
  std::vector<double> recv_wait_ms;  // per run
  uint64_t peak_intermediate_bytes = 0;
};

class StaticRuntime final : public dataflow::Runtime {
 public:
  // `timeout_s`: a receive's wait before the job ends (--coll-timeout).
  StaticRuntime(std::shared_ptr<collectives::Transport> transport, double timeout_s);
  ~StaticRuntime() override;

  int allocate(int devices, std::vector<int> mesh, int island) override;
  int num_islands() const override { return 1; }
  int slice_size(int slice) const override;
  int island(int) const override { return 0; }
  std::vector<int> devices(int slice) const override;

  dataflow::ExecutablePtr load(dataflow::ProgramDef def) override;
  std::vector<dataflow::Array> execute(const dataflow::Executable& e, std::vector<dataflow::Array> inputs,
                                       const std::string& what) override;
  std::vector<dataflow::Array> call(const std::string& kernel, int slice, const std::vector<dataflow::Array>& inputs,
                                    std::vector<int64_t> attrs) override;
  dataflow::Array put(int slice, dataflow::Sharding sharding, const dataflow::TensorSpec& logical,
                      const void* data) override;
  std::vector<dataflow::HostValue> fetch(const std::vector<dataflow::Array>& arrays, const std::string& what) override;
  void wait(const dataflow::Array&) override {}  // (an array exists once execute() returned)

  // This rank's figures of `e`'s runs so far.
  static const ExecutableStats& stats(const dataflow::Executable& e);
  // This rank's shard of `a` (null outside its slice).
  static dataflow::ObjectPtr shard(const dataflow::Array& a);
  collectives::Communicator& world() { return world_; }

 private:
  std::shared_ptr<collectives::Transport> t_;
  collectives::Communicator world_;
  Executor exec_;
  std::vector<int> first_, size_;  // per slice: its first world rank and its devices
  std::map<std::string, dataflow::ExecutablePtr> calls_;  // call()'s programs, by signature
};

}  // namespace pwm::static_mpmd
