// The conformance suite (tests/mpmd/conformance.h) for the static model under mpirun -n 2, its
// cases of 2 devices that need no controller: every rank runs every test, in gtest's fixed order
// (each test is collective: every rank trains the case's run), and rank 0 checks the metrics
// against spmd_train's Trainer run in process. The same cases over threads: test_inproc.cc.
#include <gtest/gtest.h>

#include <map>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "tests/mpmd/conformance.h"

namespace pwm::mpmd::testing {
namespace {

std::vector<Case> mpi_cases() {
  std::vector<Case> v;
  for (const Case& c : static_cases())
    if (c.workers == kWorkers) v.push_back(c);
  return v;
}
collectives::MpiEnvironment* g_env = nullptr;

class StaticMpi : public ::testing::TestWithParam<Case> {};

TEST_P(StaticMpi, MatchesSpmdTrain) {
  const Case& c = GetParam();
  const std::string dir = temp_dir("static_mpi_" + c.name);
  const auto k = register_case(c, dir + "/static.jsonl", "static_mpi_" + c.name + "_");
  {
    const auto attached = k.devices->attach(g_env->transport(), k.data);
    train_static_case(k, g_env->transport());
  }
  if (g_env->rank() == 0) expect_matches_spmd(c, dir + "/static.jsonl", dir);
  collectives::Communicator::world(g_env->transport()).barrier();  // (rank 0's check done before the next case)
}

INSTANTIATE_TEST_SUITE_P(Conformance, StaticMpi, ::testing::ValuesIn(mpi_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace pwm::mpmd::testing

int main(int argc, char** argv) {
  pwm::collectives::MpiEnvironment env(&argc, &argv);
  return pwm::collectives::run_mpi_main(env, [&] {
    ::testing::InitGoogleTest(&argc, argv);
    PWM_CHECK(env.size() == pwm::mpmd::testing::kWorkers, "run under mpirun -n {}", pwm::mpmd::testing::kWorkers);
    pwm::mpmd::testing::g_env = &env;
    // Only rank 0 prints gtest's report; every rank runs every test (they are collective).
    if (env.rank() != 0) delete ::testing::UnitTest::GetInstance()->listeners().Release(
                             ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
    return RUN_ALL_TESTS();
  });
}
