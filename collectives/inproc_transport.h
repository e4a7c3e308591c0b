// Ranks as threads of one process: a Transport for unit tests of the algorithms (gloo tests its
// algorithms over an in-memory rendezvous the same way).
//
// Sends are eager: the payload is copied into the receiver's mailbox (or straight into a posted
// receive), so isend completes at once. Thread-safe across ranks; each rank's Transport is used
// by its own thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/transport.h"
#include "common/check.h"

namespace pwm::collectives {

// Thrown by the in-process transport's abort(): the watchdog's report, catchable in tests.
class CollectiveTimeout : public pwm::Error {
 public:
  using pwm::Error::Error;
};

class InProcFabric {
 public:
  explicit InProcFabric(int world_size);
  ~InProcFabric();
  int size() const { return size_; }
  // The transport of world rank `rank`; the fabric must outlive it.
  std::shared_ptr<Transport> transport(int rank);

  struct Mailbox;  // implementation detail

 private:
  int size_;
  std::vector<std::unique_ptr<Mailbox>> boxes_;
};

// Runs fn(rank, transport) on `n` threads over a fresh fabric and rethrows the first exception.
void run_inproc(int n, const std::function<void(int rank, std::shared_ptr<Transport>)>& fn);

}  // namespace pwm::collectives
