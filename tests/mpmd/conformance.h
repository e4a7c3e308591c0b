// The MPMD trainer's conformance suite (mpmd/trainer.h): one list of cases, run for both execution
// models over two transports (IFRT's practice: conformance tests written once against the
// interface, run for every backend).
//
//   tests/pathways_train/test_inproc.cc  the controller and the workers as threads of one process;
//   tests/pathways_train/test_mpi.cc     the same cases under mpirun -n 3 (rank 0 the controller),
//                                        those of 2 workers (the dp 3 cases run in process);
//   tests/static_mpmd/test_inproc.cc     the static model's cases (those needing no controller),
//                                        every rank a thread.
//
// The reference is independent of the transport under test: spmd_train's Trainer, run on threads
// over the in-process transport with the same workload, dp/tp sharding and micro-batches. Fused,
// chained and opbyop must give its bits (every step's loss, learning rate and gradient norm, the
// validation losses, the final weights hash); the pipeline agrees to 1e-5 relative (it sums the
// tied embedding's two gradient parts in another order: docs/pathways_train_pipeline.md).
// The same cases, from the command line, are tests/pathways_train/pathways_cases.py and
// tests/static_mpmd/static_cases.py.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "train/data.h"
#include "train/config.h"
#include "mpmd/backend.h"
#include "pathways/client.h"
#include "programs/kernels.h"
#include "programs/step_io.h"

namespace pwm::mpmd::testing {

using programs::DeviceSet;
using programs::KernelNames;

struct Case {
  std::string name;
  std::vector<std::string> flags;  // workload flags on top of the tiny model (mesh, micro-batches, ...)
  pwm::train::MpmdConfig po;      // the MPMD settings (granularity, stages, schedule, islands)
  bool bitwise = true;             // else: losses within 1e-5 relative (the pipeline)
  int workers = 2;                 // worker devices (ranks: one more, the controller)
};
const std::vector<Case>& cases();
// The cases the static model runs: not those that need a controller (opbyop, a client calling
// node by node; sequential dispatch; the controller's MoE routing; the expert island).
std::vector<Case> static_cases();
// gtest prints a case by its name (not its bytes) in the test list.
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
constexpr int kWorkers = 2;  // the MPI suite's (mpirun -n 3): it runs the cases of 2 workers

// A case's workload, writing its metrics to `metrics` (validated for its workers' devices).
pwm::train::TrainConfig workload(const Case& c, const std::string& metrics);

// The kernels of one case: a device set for its workload, registered under its own prefix.
struct CaseKernels {
  pwm::train::TrainConfig cfg;
  std::shared_ptr<DeviceSet> devices;
  KernelNames names;
  std::shared_ptr<const pwm::train::TextDataset> data;
};
CaseKernels register_case(const Case& c, const std::string& metrics, const std::string& prefix);

// Controller side: trains the case through `client` (the workers already hold their devices).
void train_case(const CaseKernels& k, const Case& c, pathways::Client& client, int num_islands);
// Every rank of the static model: trains the case over `t` (this rank's device attached).
void train_static_case(const CaseKernels& k, std::shared_ptr<collectives::Transport> t);

// Runs spmd_train's Trainer on the case's workload (threads, in-process) and checks the
// pathways run's metrics file against it with gtest assertions.
void expect_matches_spmd(const Case& c, const std::string& pathways_metrics, const std::string& dir);

std::string temp_dir(const std::string& tag);  // a fresh directory under the gtest temp dir

}  // namespace pwm::mpmd::testing
