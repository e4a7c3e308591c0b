// The static model's executor: runs this rank's part of a lowered program (its
// dataflow::WorkerProgram) with no controller (docs/static_mpmd.md), through the instruction-list
// interpreter the Pathways worker also runs (dataflow/interpreter.h), in order: kernels in list
// order, a receive posted where the walk stands, a send as soon as its value exists, all
// non-blocking, one tag per transfer of the run. Every rank lowers the same program with the
// same slice mapping, so every rank's list is a slice of one global order, and a collective
// kernel is reached by every member of its slice in the same node order: the order fixed when
// the program was built is the deadlock freedom (OneFlow's argument), not a scheduler at run time.
//
// Ownership: inputs are shared with the caller (read-only), outputs are new objects the caller
// owns; every other slot takes its memory at its first write and gives it back after its last
// use on this rank (a transfer in flight holds its buffer until it completes), so a stage holds
// the activations its order keeps alive (1F1B: S - s micro-batches), not all of them. Blocks
// until this rank's part is done (its sends included). A kernel that fails throws, naming it; a
// run that makes no progress for `timeout_s` throws, naming the transfer it waits for, the peer
// and the program: the caller ends the job (run_mpi_main). One thread per rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/transport.h"
#include "dataflow/interpreter.h"
#include "dataflow/lowering.h"

namespace pwm::static_mpmd {

// A program's values on this rank: its shard of parameter (or output) `index`.
using Shards = std::map<uint32_t, dataflow::ObjectPtr>;

// What one run did on this rank.
struct RunStats {
  double kernel_s = 0;       // in kernels
  double recv_wait_s = 0;    // in passes that moved nothing: waiting for peers (the static order's bubble)
  uint64_t messages = 0;     // point-to-point sends
  uint64_t bytes_sent = 0;
  uint64_t peak_intermediate_bytes = 0;  // the run's slots alive at once, beyond its inputs
  uint64_t donated_bytes = 0;  // inputs whose buffers outputs took (written in place)
};

class Executor {
 public:
  // `channel`: the first of two tag channels the transfers use (collectives::kFirstFreeChannel
  // and above: the Communicators' contexts stay below).
  Executor(std::shared_ptr<collectives::Transport> transport, double timeout_s, int channel);
  ~Executor();

  // Runs `p` (this rank's list) on `inputs` (one shard per parameter bound here); returns the
  // shards of the program's outputs held here. Every rank of the program calls it for the same
  // program, in the same order of runs (the tags of a run follow from the number of runs before).
  // A shard of which `inputs` holds the last reference is donated (dataflow::Walk::donate).
  Shards run(const dataflow::Plan& p, Shards inputs, RunStats* stats = nullptr);

 private:
  class Host;
  std::string describe_wait(const dataflow::Walk& w, const dataflow::WorkerProgram& p) const;
  int tag(uint32_t xfer) const;

  std::shared_ptr<collectives::Transport> t_;
  double timeout_s_;
  int channel_;
  uint64_t runs_ = 0;  // the tag base: each run takes the next dataflow::kMaxTransfersPerProgram tags
  dataflow::SliceComms comms_;
};

}  // namespace pwm::static_mpmd
