// MPI from MPI_Init to MPI_Finalize or MPI_Abort (mpi_transport.h): MpiEnvironment, with the
// start-up's checks of every rank's PWM_* settings and the deadline every start-up exchange has
// (wait_startup, which the transport's start-up uses too), run_mpi_main, and the report of a
// failed MPI call (mpi_error_string, report_mpi_failure: mpi_impl.h's macros). The transport
// itself: mpi_transport.cc.
#include "collectives/mpi_transport.h"

#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/mpi_impl.h"
#include "common/check.h"
#include "common/env.h"
#include "common/hash.h"
#include "common/time.h"

#define PWM_MPI_SOURCE "collectives/mpi_environment.cc"

namespace pwm::collectives {

namespace {

// The world rank for PWM_MPI_REPORT's lines; -1 until MpiEnvironment has asked MPI.
int g_world_rank = -1;

// The start-up exchanges (the environment check, the host names, the clock sync, the channels)
// have a deadline: a rank stopped or dead after MPI_Init must not hang the job. The collectives'
// timeout, or its default while the environment is not checked yet.
double startup_timeout_s() {
  try {
    return env_double("PWM_COLL_TIMEOUT", 300);
  } catch (const std::exception&) {
    return 300;
  }
}

// For the start-up timeout's line only, on the way to MPI_Abort: a failure is reported and the
// line names no host ("").
std::string this_host() {
  char buf[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  PWM_MPI_REPORT(MPI_Get_processor_name(buf, &len));
  return std::string(buf, static_cast<size_t>(len));
}

}  // namespace

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  // Called to describe another failure: its own failure must not replace that report.
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
    return fmt::format("MPI error code {} (MPI_Error_string failed on it)", code);
  return std::string(buf, len);
}

void report_mpi_failure(const char* source, const char* call, int line, int rc) {
  std::fprintf(stderr, "warning: [rank %s] %s:%d: %s failed: %s\n",
               g_world_rank >= 0 ? std::to_string(g_world_rank).c_str() : "?", source, line, call,
               mpi_error_string(rc).c_str());
  std::fflush(stderr);
}

// Completes the start-up requests `reqs`, or ends the job with one line naming `what` after the
// timeout. Polls (MPI progresses inside MPI_Testall), yielding the core between tests.
void wait_startup(std::vector<MPI_Request>& reqs, const std::string& what) {
  const double timeout = startup_timeout_s();
  const int64_t start = now_us();
  for (int spins = 0;; ++spins) {
    int flag = 0;
    PWM_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) return;
    const double waited = 1e-6 * static_cast<double>(now_us() - start);
    if (waited > timeout) {
      // On the way to MPI_Abort: a failure here is reported, not thrown over the timeout's line.
      int rank = g_world_rank;
      PWM_MPI_REPORT(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
      MpiEnvironment::abort_job(
          fmt::format("start-up: world rank {} on {} waited {:.1f} s for {}: a rank is stopped, dead or slow to start; "
                      "aborting the job (timeout: PWM_COLL_TIMEOUT)",
                      rank, this_host(), waited, what),
          3);
    }
    if (spins < 1000)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void wait_startup(MPI_Request r, const std::string& what) {
  std::vector<MPI_Request> v{r};
  wait_startup(v, what);
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv, const std::function<void(int)>& after_init) {
  int provided = 0;
  PWM_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  // Until this succeeds, a failing MPI call on the world aborts inside MPI (the default
  // MPI_ERRORS_ARE_FATAL); every check after it relies on it.
  PWM_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  PWM_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  g_world_rank = rank_;
  PWM_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  if (after_init) after_init(rank_);
  if (provided < MPI_THREAD_SERIALIZED && rank_ == 0)
    std::fprintf(stderr, "warning: MPI provides thread level %d < MPI_THREAD_SERIALIZED\n", provided);
  refuse_bad_environment(argc && argv && *argc > 0 ? (*argv)[0] : nullptr);
  // A library this project cannot use (e.g. a non-conforming tag bound) is one line and a
  // non-zero exit of the job, not an exception escaping main on every rank.
  try {
    transport_ = make_mpi_transport();
  } catch (const std::exception& e) {
    abort_job(fmt::format("error: [rank {}] {}", rank_, error_line(e)), 1);
  }
}

void MpiEnvironment::refuse_bad_environment(const char* argv0) {
  // Every PWM_* setting is checked here, before anything reads one (common/env.h): the lowest
  // rank with a bad value prints one line, and every rank leaves MPI and exits non-zero. The
  // ranks agree first, since an MPMD launch may give them different environments.
  const std::string bad = check_environment();
  int mine = bad.empty() ? size_ : rank_, first = size_;
  MPI_Request req;
  if (MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    first = mine;
  else
    wait_startup(req, "every rank's check of its PWM_* environment (an allreduce)");
  const char* slash = argv0 ? std::strrchr(argv0, '/') : nullptr;
  const char* program = argv0 ? (slash ? slash + 1 : argv0) : "error";
  std::string differs;
  if (first == size_) {
    differs = settings_difference();
    if (differs.empty()) return;
    first = 0;
  }
  if (rank_ == first) {
    std::fprintf(stderr, "%s: error: %s\n", program, (bad.empty() ? differs : bad).c_str());
    std::fflush(stderr);
  }
  PWM_MPI_REPORT(MPI_Finalize());  // on the way to exit(1) with the line above: report, go on
  std::exit(1);
}

std::string MpiEnvironment::settings_difference() {
  // The ranks must share every PWM_* setting: one that differs changes what the ranks do (a
  // fingerprinted collective on one rank only, another timeout) and would surface later as "the
  // ranks called different collectives". Compared before anything reads one, by a hash (two
  // 8-byte allreduces); the texts are gathered only to name the difference.
  std::string mine;
  for (const auto& [name, value] : settings_in_effect()) mine += name + "=" + value + "\n";
  const uint64_t h = fnv1a64(mine);
  uint64_t lo = h, hi = h;
  std::vector<MPI_Request> reqs(2);
  PWM_MPI(MPI_Iallreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, &reqs[0]));
  PWM_MPI(MPI_Iallreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &reqs[1]));
  wait_startup(reqs, "every rank's PWM_* settings (an allreduce)");
  if (lo == hi) return "";
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size_)), offs(static_cast<size_t>(size_));
  MPI_Request r;
  PWM_MPI(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD, &r));
  wait_startup(r, "every rank's PWM_* settings (an allgather)");
  int total = 0;
  for (int i = 0; i < size_; ++i) offs[static_cast<size_t>(i)] = std::exchange(total, total + lens[static_cast<size_t>(i)]);
  std::string all(static_cast<size_t>(total), '\0');
  PWM_MPI(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, MPI_COMM_WORLD, &r));
  wait_startup(r, "every rank's PWM_* settings (an allgatherv)");
  auto of = [&](int rank) { return all.substr(static_cast<size_t>(offs[static_cast<size_t>(rank)]), static_cast<size_t>(lens[static_cast<size_t>(rank)])); };
  int odd = 1;
  while (odd < size_ && of(odd) == of(0)) ++odd;
  return fmt::format("rank {} runs with other PWM_* settings than rank 0 ({}): export the same settings to every rank "
                     "(mpirun -x NAME=VALUE, or unset them)",
                     odd, describe_settings_difference(of(odd), of(0)));
}

// A destructor: failures are reported, not thrown (std::terminate), and the process ends anyway.
MpiEnvironment::~MpiEnvironment() {
  transport_.reset();
  int finalized = 0;
  PWM_MPI_REPORT(MPI_Finalized(&finalized));
  if (!finalized) PWM_MPI_REPORT(MPI_Finalize());
}

std::string MpiEnvironment::processor_name() const {
  char buf[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  PWM_MPI(MPI_Get_processor_name(buf, &len));
  return std::string(buf, len);
}

void MpiEnvironment::abort_job(const std::string& message, int code) {
  if (!message.empty()) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    // The line is in the launcher's pipe, not yet on the user's terminal: MPICH's MPI_Abort ends
    // every process of the job at once, its proxies included, and a line they have not forwarded
    // yet is lost (seen in CI: a worker's full-disk error ended the job with an empty stderr).
    // The same grace as the watchdog's lets it through.
    std::this_thread::sleep_for(std::chrono::milliseconds(kAbortGraceMs));
  }
  // Ending the job: a failure is reported and the process ends by itself below.
  PWM_MPI_REPORT(MPI_Abort(MPI_COMM_WORLD, code));
  std::_Exit(code);  // MPI_Abort does not return; be sure.
}

int run_mpi_main(MpiEnvironment& env, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    MpiEnvironment::abort_job(fmt::format("error: [rank {}] {}", env.rank(), error_line(e)), 1);
  }
}

}  // namespace pwm::collectives
