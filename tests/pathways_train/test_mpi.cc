// The conformance suite (conformance.h) under mpirun -n 3: world rank 0 is the controller and
// runs the tests, ranks 1 and 2 are the workers. Every rank registers every case's kernels (each
// under its own prefix) before the runtime starts; the workers attach their devices and serve
// until the controller shuts the runtime down after the last test.
#include <gtest/gtest.h>

#include "collectives/mpi_transport.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "tests/pathways_train/conformance.h"

namespace pwm::pathways::train::testing {
namespace {

struct Registered {
  CaseKernels kernels;
  std::string dir;
};
std::vector<Registered>* g_cases = nullptr;
Runtime* g_rt = nullptr;

class Mpi : public ::testing::TestWithParam<size_t> {};

TEST_P(Mpi, MatchesSpmdTrain) {
  const Case& c = cases()[GetParam()];
  const Registered& r = (*g_cases)[GetParam()];
  Client client = g_rt->client("trainer-" + c.name);
  train_case(r.kernels, c, client, g_rt->num_islands());
  expect_matches_spmd(c, r.dir + "/pathways.jsonl", r.dir);
}

INSTANTIATE_TEST_SUITE_P(Conformance, Mpi, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) { return cases()[i.param].name; });

}  // namespace
}  // namespace pwm::pathways::train::testing

int main(int argc, char** argv) {
  using namespace pwm::pathways::train::testing;
  pwm::collectives::MpiEnvironment env(&argc, &argv);
  return pwm::collectives::run_mpi_main(env, [&] {
    ::testing::InitGoogleTest(&argc, argv);
    PWM_CHECK(env.size() == kWorkers + 1, "run under mpirun -n {}", kWorkers + 1);
    std::vector<Registered> regs;
    std::vector<pwm::pathways::train::DeviceSet::Attached> attached;  // until run_worker returns
    for (const Case& c : cases()) {
      const std::string dir = env.rank() == 0 ? temp_dir("mpi_" + c.name) : "";
      regs.push_back({register_case(c, dir + "/pathways.jsonl", "mpi_" + c.name + "_"), dir});
      if (env.rank() != 0) attached.push_back(regs.back().kernels.devices->attach(env.transport(), regs.back().kernels.data));
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
