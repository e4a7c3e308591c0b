// The conformance suite (tests/mpmd/conformance.h) with the controller and both workers as threads of this
// process, over the in-process transport: no mpirun.
#include <gtest/gtest.h>

#include "collectives/inproc_transport.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "tests/mpmd/conformance.h"

namespace pwm::mpmd::testing {

using namespace pwm::pathways;
namespace {

class InProc : public ::testing::TestWithParam<Case> {};

TEST_P(InProc, MatchesSpmdTrain) {
  const Case& c = GetParam();
  const std::string dir = temp_dir("inproc_" + c.name);
  // Each case registers its kernels under its own prefix: the registry is one per process.
  const CaseKernels k = register_case(c, dir + "/pathways.jsonl", "inproc_" + c.name + "_");
  collectives::run_inproc(c.workers + 1, [&](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) {
      const auto attached = k.devices->attach(t, k.data);
      return run_worker(t);
    }
    RuntimeOptions ro;
    ro.islands = c.po.islands;
    Runtime rt(t, ro);
    Client client = rt.client("trainer");
    train_case(k, c, client, rt.num_islands());
    rt.shutdown();
  });
  expect_matches_spmd(c, dir + "/pathways.jsonl", dir);
}

INSTANTIATE_TEST_SUITE_P(Conformance, InProc, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace pwm::mpmd::testing
