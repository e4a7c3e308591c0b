// The Pathways runtime over threads (collectives::run_inproc) through hundreds of context
// retirements (issue 58; docs/pathways_liveness.md, "Reclaiming a context").
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "collectives/inproc_transport.h"
#include "dataflow/program.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "tests/pathways/test_kernels.h"

namespace pwm::pathways {
namespace {

// Issue 58: a context block retired after a loss (here a drain, which remaps the slice onto the
// spare device and retires its block as a loss does) returns to the pool once its members have
// counted and drained it, so the runtime survives any number of retirements: 400 drains, more
// than the 179 blocks (178 retired ran them out before), each followed by a collective on the
// remapped slice, on a block handed out again, whose exact sum is checked. Each block is left
// what collectives abandoned after a loss leave (stray_message: messages on the tag of its first
// collective that no receive took, between every two devices): the fresh communicator of a later
// slice on the block, which shares two devices with this one, would take them for its first
// AllReduce's data unless the reclaim drained them.
TEST(InProcRuntime, SurvivesHundredsOfRetiredContexts) {
  testing::register_test_kernels();
  collectives::run_inproc(5, [](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) return run_worker(t);
    Runtime rt(t);
    Client c = rt.client();
    Slice s = c.allocate(3);  // (of 4 devices: any two of its groups share two devices)
    Array x0 = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0});
    ProgramBuilder b("sum");
    b.output(b.call("allreduce_add", s, {b.param_like(x0)}, {1})[0]);
    Program prog = b.build();
    ProgramBuilder sb("stray");
    sb.output(sb.call("stray_message", s, {sb.param_like(x0)})[0]);
    Program stray = sb.build();
    x0 = Array();
    for (int i = 0; i < 400; ++i) {
      const int d = s.devices()[static_cast<size_t>(i % 3)];
      c.drain(d);
      const std::vector<int> now_on = s.devices();
      ASSERT_EQ(std::count(now_on.begin(), now_on.end(), d), 0) << "drain " << i;
      Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{static_cast<float>(i)});
      ASSERT_EQ(c.run(prog, {x})[0].get<float>(), std::vector<float>{3.0f * i + 1}) << "after drain " << i;
      c.run(stray, {x})[0].wait();
      c.undrain(d);
    }
    rt.shutdown();
  });
}

}  // namespace
}  // namespace pwm::pathways
