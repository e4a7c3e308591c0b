// survive_probe: can this MPI library and launcher keep a job running after one of its ranks is
// SIGKILLed? (docs/failures.md, "What the MPI libraries here allow"; run by
// mpi_scripts/survive_probe.sh under each launcher's options.)
//
// Three ranks: rank 0 (a controller) exchanges a message with ranks 1 and 2 each round over
// point-to-point calls under MPI_ERRORS_RETURN; rank 2 SIGKILLs itself in round 5. Rank 0 notices
// the silence by its own timeout (no MPI call reports it) and goes on with rank 1. It prints one
// line: "survived: N exchanges with rank 1 after rank 2's loss" (N = the rounds left, 19, when
// the survivors keep working), then whether MPI_Finalize returned. SIGUSR1 is ignored (Hydra's
// -disable-auto-cleanup signals the survivors with it). Not a test of this project's code: a
// probe of the library under it.
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Polls `r` for up to `limit` seconds: 1 completed, 0 timed out, -1 an MPI error.
int wait_for(MPI_Request* r, double limit) {
  const double t0 = now_s();
  while (now_s() - t0 < limit) {
    int done = 0;
    if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
    if (done) return 1;
    usleep(100);
  }
  return 0;
}

constexpr int kRounds = 25, kKillRound = 5, kWorkers = 2;

void controller() {
  bool alive[kWorkers + 1] = {false, true, true};
  int after = 0;
  for (int round = 0; round < kRounds; ++round)
    for (int w = 1; w <= kWorkers; ++w) {
      if (!alive[w]) continue;
      int x = round, y = -1;
      MPI_Request s, r;
      MPI_Isend(&x, 1, MPI_INT, w, 7, MPI_COMM_WORLD, &s);
      MPI_Irecv(&y, 1, MPI_INT, w, 8, MPI_COMM_WORLD, &r);
      const int got = wait_for(&r, 2.0);
      if (got != 1) {
        std::printf("survive_probe: round %d: rank %d %s; going on without it\n", round, w,
                    got < 0 ? "gave an MPI error" : "silent for 2 s");
        std::fflush(stdout);
        alive[w] = false;  // (its requests are left: their peer is gone)
        continue;
      }
      wait_for(&s, 2.0);
      if (!alive[2] && w == 1) ++after;
    }
  std::printf("survived: %d exchanges with rank 1 after rank 2's loss (of %d)\n", after, kRounds - kKillRound - 1);
  std::fflush(stdout);
}

void worker(int rank) {
  for (int round = 0; round < kRounds; ++round) {
    if (rank == 2 && round == kKillRound) std::raise(SIGKILL);
    int x = -1;
    MPI_Request r;
    MPI_Irecv(&x, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, &r);
    if (wait_for(&r, 10.0) != 1) return;
    MPI_Send(&x, 1, MPI_INT, 0, 8, MPI_COMM_WORLD);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::signal(SIGUSR1, SIG_IGN);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != kWorkers + 1) {
    if (rank == 0) std::fprintf(stderr, "survive_probe: error: run with exactly 3 ranks (got %d)\n", size);
    MPI_Finalize();
    return 2;
  }
  if (rank == 0)
    controller();
  else
    worker(rank);
  alarm(10);  // MPI_Finalize may wait for the dead rank: end the process then
  MPI_Finalize();
  if (rank == 0) std::printf("survive_probe: MPI_Finalize returned\n");
  return 0;
}
