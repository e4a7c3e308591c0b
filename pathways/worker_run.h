// Internal to worker.cc: what the worker loop keeps per loaded program, per run and per object
// migration (docs/pathways.md, "Dispatch" and "Life of a buffer"). Used by the worker thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/messages.h"
#include "pathways/object_store.h"

namespace pwm::pathways::worker_detail {

struct LoadedProgram {
  dataflow::WorkerProgram p;
  std::vector<const dataflow::KernelDef*> kernels;  // per exec; nullptr: not registered here
  mutable std::vector<std::shared_ptr<collectives::Communicator>> comms;  // per exec, on first use
  mutable std::vector<double> last_s;  // per exec: how long it last ran here (s; 0: not yet)
  std::vector<uint32_t> readers;       // per slot: instructions reading it (exec inputs, sends, copies)
  std::vector<uint8_t> intermediate;   // per slot: bound to no parameter and no output
  std::vector<uint32_t> execs_before;  // per instruction: kExec instructions before it
  std::vector<uint32_t> transfers;     // the kSend and kRecv instructions, in program order
};

enum : uint8_t { kWaiting = 0, kPosted = 1, kDone = 2 };

// A worker-local run flag: the run's client was freed while the run waited for memory (its
// outputs are not entered in the store).
constexpr uint8_t kRunOwnerGone = 0x80;
// A worker-local run flag: cancelled (CancelRun) while it waited for memory: it fails at once.
constexpr uint8_t kRunCancelled = 0x40;

struct Run {
  RunHeader h;
  std::shared_ptr<const LoadedProgram> prog;
  std::vector<ObjectPtr> slots;
  std::vector<uint8_t> state;                // per instruction
  std::vector<collectives::Request> reqs;    // per instruction, while posted
  std::vector<uint64_t> order;               // per instruction: exec order number (kExec only)
  std::vector<double> posted_at;             // per instruction, when recording a trace: now_s() before post
  std::vector<uint32_t> stage_left;          // instructions not done, per stage
  uint32_t released = 0;                     // stages < released may run
  size_t first = 0, left = 0;
  std::string error;                         // first error on this worker
  double kernel_s = 0;                       // summed kernel durations
  const Object* blocked_on = nullptr;        // see progress_run's fast path
  std::vector<uint32_t> readers_left;        // per slot: readers not done (the slot is dropped at 0)
  std::vector<uint8_t> counted;              // per slot: its bytes are in the worker's intermediate count
  uint32_t execs_done = 0;                   // kExec instructions done
  size_t next_exec = 0;                      // kRunInOrder: the first kExec instruction not done
};

// A transfer of a cancelled run that was posted: its buffer stays alive until MPI is done with it,
// which is never when the peer was lost (the worker keeps it until it exits).
struct Abandoned {
  collectives::Request req;
  ObjectPtr buf;
};

struct Move {
  bool out = false;
  uint64_t object = 0;
  ObjectPtr obj;
  int peer = 0, tag = 0;
  bool posted = false;
  collectives::Request req;
};

}  // namespace pwm::pathways::worker_detail
