// The static model over the in-process transport (every rank a thread of this process, no
// mpirun): the MPMD trainer's conformance cases (tests/mpmd/conformance.h) that the static
// model runs, each against spmd_train's Trainer on the same workload, bitwise (the pipeline to
// 1e-5 relative: its tied gradient's order, as pathways_train's). The same trainer over MPI:
// static_cases.py.
#include <gtest/gtest.h>

#include "collectives/inproc_transport.h"
#include "tests/mpmd/conformance.h"

namespace pwm::mpmd::testing {
namespace {

class StaticInProc : public ::testing::TestWithParam<Case> {};

TEST_P(StaticInProc, MatchesSpmdTrain) {
  const Case& c = GetParam();
  const std::string dir = temp_dir("static_inproc_" + c.name);
  const auto k = register_case(c, dir + "/static.jsonl", "static_inproc_" + c.name + "_");
  collectives::run_inproc(c.workers, [&](int, std::shared_ptr<collectives::Transport> t) {
    const auto attached = k.devices->attach(t, k.data);
    train_static_case(k, t);
  });
  expect_matches_spmd(c, dir + "/static.jsonl", dir);
}

INSTANTIATE_TEST_SUITE_P(Conformance, StaticInProc, ::testing::ValuesIn(static_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace pwm::mpmd::testing
