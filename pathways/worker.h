// The worker: one device, its object store and its program cache (docs/pathways.md).
//
// Every world rank other than 0 calls run_worker() after registering its kernels; it returns
// when the controller shuts the runtime down. The worker loop (one thread, the only one in MPI
// on this rank) receives control messages, runs the instruction lists of the runs it was given,
// tests its transfers, and answers; when a pass finds nothing to do it backs off (yields, then
// sleeps 10 us doubling to `latency.worker_backoff_max_us`), because it shares the cores with
// other workers.
//
// Execution rules (why they are deadlock-free is in docs/pathways.md, "Gang scheduling"):
//  - a run's receives are posted as soon as its stage is released (at once under parallel
//    dispatch), before its inputs exist, and a send as soon as its buffer is ready, wherever
//    either sits in the instruction list (checked at every pass and after every kernel); its
//    intermediate buffers are allocated when first written (a node's outputs when it starts, a
//    receive's when it is posted; with a memory
//    cap, all at admission, so that admitted runs always fit), and every buffer of a run is
//    dropped by the run after its last reader is done (freed unless the store holds it);
//  - a run sent with kRunInOrder runs its kernels strictly in instruction order, and posts a
//    receive only when at most kInOrderRecvAhead kernels before it are left: the order is the
//    schedule (a pipeline's 1F1B), so the buffers alive at once are the schedule's;
//  - a node runs as soon as its inputs are ready, except that a node with collectives (gang
//    scheduled) waits until every node that arrived before it on this worker is done: the
//    controller sends runs to all workers of an island in one order, so every worker of a
//    slice enters its collectives in the same order;
//  - a failing node fails its outputs; the failure flows to what depends on it and to the
//    run's status, and transfers are still sent so that no peer waits for ever.
//  - runs are admitted (buffers allocated, outputs entered in the store) in arrival order; with
//    a memory cap (back-pressure) a run whose buffers do not fit waits, and so do the runs behind
//    it, until frees make room; one that could never fit fails;
//  - a run sent with the island order off (kRunUnordered, the deadlock demonstration) starts
//    its gang nodes as soon as their inputs are ready;
//  - every kernel is timed: the sum per run goes back in run_done (per-client usage), and with
//    tracing on each execution is recorded and sent to the controller before bye;
//  - memory: WorkerStats' high_water_bytes (the process's live buffers at their most) and
//    peak_intermediate_bytes (the most bytes of runs' intermediates, neither input nor output,
//    alive at once on this worker: activations and gradients in flight).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "collectives/transport.h"
#include "pathways/latency.h"

namespace pwm::pathways {

struct WorkerOptions {
  LatencyPolicy latency;  // its worker_* knobs and long_kernel_us (latency.h)
  // Back-pressure: > 0 caps the bytes of this worker's buffers (object store, run slots). A run
  // whose buffers do not fit waits, in arrival order, until frees make room; a run that needs
  // more than the cap on its own fails (PWM_PW_MEMORY_CAP, bytes).
  uint64_t memory_cap_bytes = 0;
  // Liveness (liveness.h): a controller heard from by no message for this long is stopped or
  // dead, and the job is aborted with one line naming it (PWM_COLL_TIMEOUT, 300 s by default;
  // pathways_train passes --coll-timeout).
  double timeout_s = 300;
  // In-job recovery (pathways_train --spare-workers): a kernel waiting in a collective reads the
  // controller's messages from inside the wait (the transport's wait hook), and the cancel of
  // its run (a device of the slice was lost) ends the wait with collectives::Interrupted: the
  // kernel fails, its collective is abandoned, and the worker takes the remapped slice's next
  // programs. The other messages read there wait for the loop, in order. Off: a kernel's
  // collectives wait for their peers or their watchdog.
  bool interruptible = false;
  // > 0: the watchdog of the communicators the worker makes for gang kernels (else
  // PWM_COLL_TIMEOUT, 300 s). With `interruptible`, longer than the liveness timeout
  // (kInterruptibleWatchdogFactor, liveness.h: a backstop behind the controller's verdict).
  double collective_timeout_s = 0;
  // Called on the worker's thread, between kernels, when a run that started here is cancelled
  // (a device was lost): the kernels' own state of the run is given up (pathways_train: the
  // device's started reductions, TrainingDevice::abandon_step, whichever run started them: its
  // step runs all span every slice, so a loss cancels every one in flight). Must not wait for a
  // collective. Empty: nothing.
  std::function<void()> on_cancel;
  // Called on the worker's thread, between kernels, when the controller reclaims contexts
  // [first, first + n) (a block retired after a loss, drained: docs/pathways_liveness.md): the
  // kernels drop the communicators they keep on them (a slice given the block again starts
  // their sequence numbers at 0). No run of this worker uses them. Empty: nothing.
  std::function<void(uint32_t first, uint32_t n)> on_context_reclaimed;

  static WorkerOptions from_env();  // latency: LatencyPolicy::from_env()
};

// Blocks until the controller's shutdown. Must not be called on world rank 0. `lost` (if given)
// gets the world ranks the controller lost on the way (RuntimeOptions::survive_worker_loss;
// usually none), which the rank's code after it must leave out of anything collective.
void run_worker(std::shared_ptr<collectives::Transport> transport, WorkerOptions options = WorkerOptions::from_env(),
                std::vector<int>* lost = nullptr);

}  // namespace pwm::pathways
