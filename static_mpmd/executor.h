// The static model's executor: runs this rank's part of a lowered program (its
// dataflow::WorkerProgram) front to back, with no controller (docs/static_mpmd.md).
//
// Every rank lowers the same program with the same slice mapping, so every rank's instruction
// list is a slice of one global order: a node's transfers, then the node, in node order. A rank
// walks its list: it posts each receive where it stands, and before a node's kernel waits for the
// receives posted so far; it posts each send as soon as the value exists (right after the kernel
// that wrote it), all non-blocking, one tag per transfer of the run. No rank waits for a node
// later in the order than the one it runs, and a collective kernel is reached by every member of
// its slice in the same node order: the order fixed when the program was built is the deadlock
// freedom (OneFlow's argument), not a scheduler at run time.
//
// Ownership: inputs are shared with the caller (read-only), outputs are new buffers the caller
// owns; every other slot takes its memory at its first write and gives it back after its last
// use on this rank (a transfer in flight holds its buffer until it completes), so a stage holds
// the activations its order keeps alive (1F1B: S - s micro-batches), not all of them. Blocks until this rank's part is done
// (its sends included). A receive that waits longer than `timeout_s` throws, naming the node,
// the peer and the program: the caller ends the job (run_mpi_main). One thread per rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/transport.h"
#include "dataflow/buffer.h"
#include "dataflow/lowering.h"

namespace pwm::static_mpmd {

using BufferPtr = std::shared_ptr<dataflow::Buffer>;
// A program's values on this rank: its shard of parameter (or output) `index`.
using Shards = std::map<uint32_t, BufferPtr>;

// What one run did on this rank.
struct RunStats {
  double kernel_s = 0;       // in kernels
  double recv_wait_s = 0;    // waiting for receives before kernels (the static order's bubble)
  uint64_t messages = 0;     // point-to-point sends
  uint64_t bytes_sent = 0;
  uint64_t peak_intermediate_bytes = 0;  // the run's slots alive at once, beyond its inputs
};

// A rank's instruction list with what running it needs worked out once, from the list: after
// which instruction each send can go (right after the instruction that writes its source: the
// value exists then, and the walk may reach the consumer's place in the global order a whole
// kernel later on a pipeline stage), which slots each instruction writes and last uses, and which
// slots are intermediates (bound to neither a parameter nor an output). Built once per program;
// a training step runs the same one every step.
class Prepared {
 public:
  explicit Prepared(dataflow::WorkerProgram p);
  const dataflow::WorkerProgram& program() const { return p_; }

 private:
  friend class Executor;
  dataflow::WorkerProgram p_;
  std::vector<std::vector<size_t>> sends_after_;  // per instruction, the sends it releases
  std::vector<size_t> sends_first_;               // sends of parameters: at the start
  std::vector<char> late_;                        // per instruction: a send posted where it stands
  std::vector<std::vector<int32_t>> writes_;      // per instruction, the slots it writes
  std::vector<std::vector<int32_t>> frees_;       // per instruction, the slots it uses last
  std::vector<char> intermediate_;                // per slot
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
  Shards run(const Prepared& p, const Shards& inputs, RunStats* stats = nullptr);

 private:
  struct Pending;
  struct Run;
  void post_send(Run& r, size_t instr);
  void progress(std::vector<Pending>& reqs);  // tests each once; drops the completed
  void exec(Run& r, const dataflow::Instr& in);
  collectives::Communicator& comm(const dataflow::ExecInfo& e);
  void wait_all(std::vector<Pending>& reqs, const dataflow::WorkerProgram& p, uint32_t node, RunStats* stats);
  int tag(uint32_t xfer) const;

  std::shared_ptr<collectives::Transport> t_;
  double timeout_s_;
  int channel_;
  uint64_t runs_ = 0;  // the tag base: each run takes the next dataflow::kMaxTransfersPerProgram tags
  std::map<uint32_t, std::unique_ptr<collectives::Communicator>> comms_;  // by slice context
};

}  // namespace pwm::static_mpmd
