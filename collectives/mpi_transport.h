// MPI underneath the collectives: the RAII environment and the MPI point-to-point transport.
// The environment also checks every PWM_* setting at start-up (common/env.h).
// This header does not include <mpi.h>; only collectives/*.cc do.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "collectives/transport.h"

namespace pwm::collectives {

// Initializes MPI on construction and finalizes it on destruction. Create exactly one, first
// thing in main(), on every rank. Asks for MPI_THREAD_SERIALIZED (MPI may be called from more
// than one thread, never at once). Also installs MPI_ERRORS_RETURN so that every MPI return
// code reaches our checks instead of aborting inside MPI.
class MpiEnvironment {
 public:
  // Every exchange after MPI_Init (the PWM_* check, host names, clock sync, channels) has a
  // deadline (PWM_COLL_TIMEOUT): a rank stopped there ends the job with one line, not a hang.
  // `after_init` (tests only) runs on every rank right after MPI_Init, before those exchanges.
  MpiEnvironment(int* argc, char*** argv, const std::function<void(int rank)>& after_init = {});
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The transport over MPI_COMM_WORLD (kChannels private duplicates of it, made here: the
  // constructor is collective over the world). Shared by all communicators.
  std::shared_ptr<Transport> transport() const { return transport_; }
  std::string processor_name() const;

  // Ends the whole job: prints `message` (if not empty) to stderr and calls MPI_Abort(code).
  [[noreturn]] static void abort_job(const std::string& message, int code = 1);

 private:
  // A bad PWM_* setting on any rank: one line (from the lowest such rank) and exit(1) on every
  // rank, after MPI_Finalize. Collective over the world.
  void refuse_bad_environment(const char* argv0);
  // "" when every rank has the same PWM_* settings; else the line naming the first difference.
  // Collective over MPI_COMM_WORLD (raw MPI: it runs before the transport exists).
  std::string settings_difference();

  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<Transport> transport_;
};

// Tests only: sends and receives of more than `bytes` bytes take the large-count path (a derived
// datatype) and native reductions are split into pieces of at most `bytes` bytes, so those paths
// run without 2 GiB buffers. The default is MPI's limit, 2^31 - 1. Not thread-safe; call before
// any transfer.
void set_large_count_threshold_for_testing(size_t bytes);

// Runs body() and turns an escaping exception into one line on stderr ("error: ...") and a
// non-zero exit of the whole job, so that no rank hangs waiting for a rank that died.
// Returns body()'s return value on success. Call inside main after MpiEnvironment.
int run_mpi_main(MpiEnvironment& env, const std::function<int()>& body);

}  // namespace pwm::collectives
