// The dispatcher's doorbell: its command queue and its wake-up state, shared by the client
// threads (which ring) and the dispatcher thread (which takes the commands and sleeps).
//
// A command is queued with push(); a client about to block on its answer passes wake = true and
// the sleeping dispatcher is woken at once. Otherwise it is woken only if it planned to sleep
// longer than LatencyPolicy::lazy_wake_us: a burst of OpByOp calls is then taken in a few passes
// instead of one wake-up (and context switch) per call. poke() tells the dispatcher a client
// started waiting (it re-plans its sleep); neither a poke nor a lazy command wakes it while the
// devices are predicted busy until after its planned wake-up, minus reserve_us: it will notice
// everything in time anyway, and each wake-up preempts a worker.
//
// Threads: push/poke/open/close from any thread; take/sleep from the dispatcher thread only.
// One mutex guards everything; push and poke hold it for a few instructions.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "pathways/latency.h"

namespace pwm::pathways {

class Dispatcher;

class Doorbell {
 public:
  using Command = std::function<void(Dispatcher&)>;

  explicit Doorbell(const LatencyPolicy& p) : lazy_wake_us_(p.lazy_wake_us), reserve_us_(p.reserve_us) {}

  // Queues `c`; false (and `c` dropped) when not accepting: before open() or after close().
  bool push(Command c, bool wake = false);
  void poke();
  void open();
  // Stops accepting; `last` becomes the final command if the doorbell was open. Wakes the
  // dispatcher.
  void close(Command last);

  // Dispatcher thread: moves every queued command into `out` (empty on entry).
  void take(std::vector<Command>& out);
  // Dispatcher thread: sleeps up to `wait` unless a command or a poke is pending or arrives.
  // `busy_until`: the predicted end of the work on the devices (0: none).
  void sleep(std::chrono::microseconds wait, double now, double busy_until);

 private:
  // The dispatcher is asleep but wakes before the runs on the devices are predicted to end, so
  // a new command can wait for that wake-up without leaving the devices idle. Under mu_.
  bool devices_busy_past_wake() const;

  const double lazy_wake_us_, reserve_us_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Command> queue_;
  double sleeping_until_ = 0;  // now_s() at which the dispatcher's current sleep ends (0: awake)
  double busy_until_ = 0;      // predicted completion of the last run on the devices (0: none)
  bool poked_ = false;         // a client started waiting since the dispatcher last slept
  bool accepting_ = false;
};

}  // namespace pwm::pathways
