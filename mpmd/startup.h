// What both MPMD binaries (pathways_main.cc, static_main.cc) share before their runtime starts:
// the allocator's settings, start-up (train/bootstrap.h), and the checks of a pipeline's layout.
#pragma once

#include <optional>

#include "collectives/mpi_transport.h"
#include "train/bootstrap.h"
#include "train/config.h"

namespace pwm::mpmd {

// Every rank, before MPI starts (MpiEnvironment): keeps large blocks in the heap, where freed
// memory is reused, instead of mmap/munmap per buffer (startup.cc says what that cost).
void keep_large_blocks_in_heap();

// Every rank, right after MPI starts: parses and checks the run (train::bootstrap). Returns the
// code main should return, or nullopt to go on with `s` filled and `resume` set. The checkpoint read to check it is dropped: every device's "load"
// kernel reads its shard again, so no rank keeps the whole model's copy through the run.
std::optional<int> start(int argc, char** argv, collectives::MpiEnvironment& env, const train::TrainerSpec& spec,
                         train::Startup& s, bool& resume);

// The checks both models make of --stages and the devices: at least 1, a layer per stage, and
// R x S slices of dp x tp filling `devices` (what the job has for slices); the error names the
// job's size as `mpirun -n (devices + launch_extra)` (a controller: 1). Throws pwm::Error.
void check_stages(const train::TrainConfig& cfg, int devices, int launch_extra);

}  // namespace pwm::mpmd
