// The conformance suite (tests/mpmd/conformance.h) under mpirun -n 3, its cases of 2 workers: world rank 0
// is the controller and runs the tests, ranks 1 and 2 are the workers. Every rank registers every
// such case's kernels (each under its own prefix) before the runtime starts; the workers attach
// their devices and serve until the controller shuts the runtime down after the last test.
#include <gtest/gtest.h>

#include <map>

#include "collectives/mpi_transport.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "tests/mpmd/conformance.h"

namespace pwm::mpmd::testing {

using namespace pwm::pathways;
namespace {

struct Registered {
  CaseKernels kernels;
  std::string dir;
};
std::map<size_t, Registered>* g_cases = nullptr;  // by index in cases(): those of kWorkers workers

std::vector<size_t> mpi_cases() {
  std::vector<size_t> v;
  for (size_t i = 0; i < cases().size(); ++i)
    if (cases()[i].workers == kWorkers) v.push_back(i);
  return v;
}
Runtime* g_rt = nullptr;

class Mpi : public ::testing::TestWithParam<size_t> {};

TEST_P(Mpi, MatchesSpmdTrain) {
  const Case& c = cases()[GetParam()];
  const Registered& r = g_cases->at(GetParam());
  Client client = g_rt->client("trainer-" + c.name);
  train_case(r.kernels, c, client, g_rt->num_islands());
  expect_matches_spmd(c, r.dir + "/pathways.jsonl", r.dir);
}

INSTANTIATE_TEST_SUITE_P(Conformance, Mpi, ::testing::ValuesIn(mpi_cases()),
                         [](const ::testing::TestParamInfo<size_t>& i) { return cases()[i.param].name; });

}  // namespace
}  // namespace pwm::mpmd::testing

int main(int argc, char** argv) {
  using namespace pwm::mpmd::testing;
  pwm::collectives::MpiEnvironment env(&argc, &argv);
  return pwm::collectives::run_mpi_main(env, [&] {
    ::testing::InitGoogleTest(&argc, argv);
    PWM_CHECK(env.size() == kWorkers + 1, "run under mpirun -n {}", kWorkers + 1);
    std::map<size_t, Registered> regs;
    std::vector<pwm::programs::DeviceSet::Attached> attached;  // until run_worker returns
    for (const size_t i : mpi_cases()) {
      const Case& c = cases()[i];
      const std::string dir = env.rank() == 0 ? temp_dir("mpi_" + c.name) : "";
      Registered reg{register_case(c, dir + "/pathways.jsonl", "mpi_" + c.name + "_"), dir};
      const Registered& r = regs.emplace(i, std::move(reg)).first->second;
      if (env.rank() != 0) attached.push_back(r.kernels.devices->attach(env.transport(), r.kernels.data));
    }
    if (env.rank() != 0) {
      pwm::pathways::run_worker(env.transport());
      return 0;
    }
    pwm::pathways::Runtime rt(env.transport(), pwm::pathways::RuntimeOptions{});
    g_rt = &rt;
    g_cases = &regs;
    const int rc = RUN_ALL_TESTS();
    rt.shutdown();
    return rc;
  });
}
