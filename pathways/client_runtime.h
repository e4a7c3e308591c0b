// The Pathways client as a dataflow::Runtime (dataflow/runtime.h): what the one MPMD trainer
// (mpmd/) runs on when a single controller owns the programs. Slices are the client's virtual
// slices (placed by the resource manager, remapped on a loss), arrays are its futures: execute(),
// call() and put() return at once, fetch() and wait() block on the workers' answer.
//
// Which processes call: the controller (world rank 0), from one thread; the workers serve
// (pathways::run_worker). Every run is dispatched with the RunOptions given here. `trace`
// (optional, not owned) gets a "dispatch <what>" span per run and a "wait <what>" span per fetch,
// on the controller's row.
#pragma once

#include <string>
#include <vector>

#include "common/trace.h"
#include "dataflow/runtime.h"
#include "pathways/client.h"

namespace pwm::pathways {

class ClientRuntime final : public dataflow::Runtime {
 public:
  ClientRuntime(Client& client, int num_islands, RunOptions ro = {}, Trace* trace = nullptr);

  int allocate(int devices, std::vector<int> mesh, int island) override;
  int num_islands() const override { return num_islands_; }
  int slice_size(int slice) const override { return at(slice).size(); }
  int island(int slice) const override { return at(slice).island(); }
  std::vector<int> devices(int slice) const override { return at(slice).devices(); }
  bool lost(int slice) const override { return at(slice).lost(); }

  dataflow::ExecutablePtr load(dataflow::ProgramDef def) override;
  std::vector<dataflow::Array> execute(const dataflow::Executable& e, std::vector<dataflow::Array> inputs,
                                       const std::string& what) override;
  std::vector<dataflow::Array> call(const std::string& kernel, int slice, const std::vector<dataflow::Array>& inputs,
                                    std::vector<int64_t> attrs) override;
  dataflow::Array put(int slice, dataflow::Sharding sharding, const dataflow::TensorSpec& logical,
                      const void* data) override;
  std::vector<dataflow::HostValue> fetch(const std::vector<dataflow::Array>& arrays, const std::string& what) override;
  void wait(const dataflow::Array& a) override;
  uint64_t puts() override;

  // The client's array behind `a`.
  static const Array& array(const dataflow::Array& a);

 private:
  const Slice& at(int slice) const { return slices_.at(static_cast<size_t>(slice)); }
  std::vector<Array> arrays(const std::vector<dataflow::Array>& in) const;
  std::vector<dataflow::Array> wrap(const std::vector<Array>& out, int slice, const dataflow::ProgramDef* def) const;

  Client& client_;
  int num_islands_;
  RunOptions ro_;
  Trace* trace_;
  std::vector<Slice> slices_;  // by index
};

}  // namespace pwm::pathways
