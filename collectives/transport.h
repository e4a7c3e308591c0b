// Point-to-point transport under the collectives: the only thing algorithms talk to.
//
// Algorithms never see MPI (gloo's split of algorithms from transports). Two implementations:
// MpiTransport (mpi_transport.h, OpenMPI through MPI_Isend/MPI_Irecv on a private duplicate of
// MPI_COMM_WORLD) and InProcFabric (inproc_transport.h, ranks as threads of one process, for fast
// unit tests).
//
// Matching: a receive matches the oldest unmatched send with the same (source, tag), MPI's
// non-overtaking rule. Thread safety: one transport object per rank, used by one thread at a
// time (the MPI transport asks for MPI_THREAD_SERIALIZED or better).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/types.h"

namespace pwm::collectives {

// An in-flight send or receive. Opaque; valid until the transport's test() returns true.
struct Request {
  uint64_t handle = 0;
};

// A collective run by the transport's native library on a group (algorithm kMpi).
class NativeOp {
 public:
  virtual ~NativeOp() = default;
  virtual bool test() = 0;  // true once complete; throws pwm::Error on failure
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;  // this process's world rank
  virtual int size() const = 0;  // world size
  virtual int max_tag() const = 0;
  virtual std::string name() const = 0;

  // Start a send/receive of `bytes` bytes to/from world rank `peer`. The buffer must stay valid
  // and (for a send) unmodified until test() reports completion.
  virtual Request isend(const void* buf, size_t bytes, int peer, int tag) = 0;
  virtual Request irecv(void* buf, size_t bytes, int peer, int tag) = 0;

  // Non-blocking completion check. On completion of a receive, *received is set to the number of
  // bytes that arrived. Throws pwm::Error on a transport failure (e.g. a message longer than
  // the posted receive).
  virtual bool test(Request& r, size_t* received) = 0;

  // Called by a waiting collective when a progress pass found nothing to do. MPI must be polled
  // (its progress engine runs inside MPI_Test), so the MPI transport does nothing; the
  // in-process fabric yields so that oversubscribed rank threads can run.
  virtual void idle() {}

  // Ends the whole job after a fatal collective error (the watchdog). The MPI transport prints
  // `message` and calls MPI_Abort; the in-process fabric throws CollectiveTimeout.
  [[noreturn]] virtual void abort(const std::string& message) = 0;

  // Algorithm kMpi. The default throws: only the MPI transport has a native library.
  // `group` lists world ranks; every member must call it, in the same order as other kMpi calls.
  virtual std::unique_ptr<NativeOp> start_native_allreduce(const std::vector<int>& group,
                                                           const void* send, void* recv,
                                                           size_t count, DataType dtype,
                                                           ReduceOp op);
};

}  // namespace pwm::collectives
