// Internal to the collectives' MPI sources, the only code that includes <mpi.h>:
//   mpi_environment.cc  MPI_Init to MPI_Finalize or MPI_Abort (MpiEnvironment, run_mpi_main):
//                       the start-up checks and their deadline (wait_startup), and the report
//                       of a failed MPI call (mpi_error_string, report_mpi_failure)
//   mpi_transport.cc    the transport over MPI_COMM_WORLD (MpiTransport): point-to-point on
//                       its channels, MPI's own collectives (algorithm 'mpi'), the clock sync
// Each function is described where it is defined.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "collectives/transport.h"
#include "common/check.h"

namespace pwm::collectives {

// How long a rank whose watchdog fired waits, after printing its report, before MPI_Abort.
inline constexpr int kAbortGraceMs = 1000;

// mpi_environment.cc
std::string mpi_error_string(int code);
void report_mpi_failure(const char* source, const char* call, int line, int rc);
void wait_startup(std::vector<MPI_Request>& reqs, const std::string& what);
void wait_startup(MPI_Request r, const std::string& what);

// mpi_transport.cc: the transport over MPI_COMM_WORLD; collective over the world.
std::shared_ptr<Transport> make_mpi_transport();

// Every MPI return code is checked (docs/errors.md). A failure names the call and where it is:
// PWM_MPI_SOURCE, which each source defines as its own name, and the line.
#define PWM_MPI(call)                                                                    \
  do {                                                                                   \
    int pwm_rc_ = (call);                                                                \
    if (pwm_rc_ != MPI_SUCCESS) [[unlikely]]                                             \
      PWM_THROW("{}:{}: {} failed: {}", PWM_MPI_SOURCE, __LINE__, #call,                 \
                mpi_error_string(pwm_rc_));                                              \
  } while (0)

// The same check where throwing would be wrong: in a destructor (an exception there ends the
// process in std::terminate), on the way out (MPI_Finalize before exit, MPI_Abort), and while
// composing the report of another failure. A failed call prints one line naming the call and
// the rank, and the caller goes on with what it was doing.
#define PWM_MPI_REPORT(call)                                                             \
  do {                                                                                   \
    int pwm_rc_ = (call);                                                                \
    if (pwm_rc_ != MPI_SUCCESS) [[unlikely]]                                             \
      report_mpi_failure(PWM_MPI_SOURCE, #call, __LINE__, pwm_rc_);                      \
  } while (0)

}  // namespace pwm::collectives
