// The deadlock matrix (issue 37): each case under each execution model either completes or ends
// within 2x the watchdog with one line naming the cause.
//
//   deadlock_matrix collective_order spmd    ranks 0 and 1 enter two AllReduces on two
//                                            communicators in opposite orders: each waits in a
//                                            different one; the collectives' watchdog names the
//                                            op and the peer and ends the job (expected failure)
//   deadlock_matrix collective_order static  the same two AllReduces as two nodes of one program
//                                            on two slices of the same ranks: every rank runs
//                                            them in the program's one order; completes
//   deadlock_matrix sendrecv_order static    two one-device slices exchange 8 MiB values both
//                                            ways (stage 0 sends then receives, stage 1 receives
//                                            then sends in its list); completes
//   deadlock_matrix missing_peer static      rank 1 never runs its part (a rank that ordered the
//                                            programs differently, or is gone): rank 0's receive
//                                            watchdog names the program, the node and the peer
//                                            and ends the job (expected failure)
//   deadlock_matrix collective_order pathways  the two AllReduces as two programs of two clients
//                                            (threads) on two slices of the same 2 workers, 20
//                                            times each: the island scheduler's one order; completes
//                                            (pathways.ordering_off_deadlocks turns it off)
//   deadlock_matrix sendrecv_order pathways  the both-ways program on two one-worker slices
// SPMD and static run on 2 ranks, Pathways on 3 (a controller and 2 workers); PWM_COLL_TIMEOUT=2.
// The quota case is mpmd_train's (tests/static_mpmd/static_cases.py, bad_inputs_fail_cleanly);
// SPMD has no point-to-point step, Pathways no quota.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "common/check.h"
#include "dataflow/builder.h"
#include "pathways/client.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "static_mpmd/executor.h"

using namespace pwm;
using dataflow::ArgSpec;
using dataflow::KernelContext;
using dataflow::Sharding;
using dataflow::TensorSpec;

namespace {

constexpr int64_t kFloats = 2 << 20;  // 8 MiB: above every eager limit, so a send needs its receive

ArgSpec rep(int64_t n) { return ArgSpec{TensorSpec{collectives::DataType::kFloat32, {n}}, Sharding::kReplicated}; }

void register_kernels() {
  auto& reg = dataflow::KernelRegistry::global();
  reg.add("fill", dataflow::Signature{{}, {rep(kFloats)}}, [](KernelContext& ctx) {
    for (float& x : ctx.out<float>(0)) x = static_cast<float>(ctx.world_rank() + 1);
  });
  reg.add("neg", dataflow::Signature{{rep(kFloats)}, {rep(kFloats)}}, [](KernelContext& ctx) {
    auto x = ctx.in<float>(0);
    auto y = ctx.out<float>(0);
    for (size_t i = 0; i < x.size(); ++i) y[i] = -x[i];
  });
  reg.add("allreduce", dataflow::Signature{{rep(kFloats)}, {rep(kFloats)}}, [](KernelContext& ctx) {
    auto x = ctx.in<float>(0);
    auto y = ctx.out<float>(0);
    ctx.comm().allreduce(x.data(), y.data(), x.size(), collectives::DataType::kFloat32, collectives::ReduceOp::kSum);
  }, /*collectives=*/true);
}

// Runs `def` on this rank over two slices: slice i on `ranks[i]`, context 1 + i.
static_mpmd::Shards run_static(std::shared_ptr<collectives::Transport> t, const dataflow::ProgramDef& def,
                               const std::vector<std::vector<int>>& ranks, bool skip_rank1 = false) {
  const auto lookup = [&](int s) {
    return dataflow::SliceMapping{ranks.at(static_cast<size_t>(s)), 1 + static_cast<uint32_t>(s), 0, 0};
  };
  dataflow::LoweredProgram lp = dataflow::lower(def, 0, lookup);
  static_mpmd::Executor exec(t, collectives::CommOptions::from_env().timeout_s, collectives::kFirstFreeChannel);
  if (skip_rank1 && t->rank() == 1) return {};
  return exec.run(dataflow::Plan(lp.workers.at(t->rank())), {});
}

float first(const static_mpmd::Shards& out, uint32_t i) { return static_cast<const float*>(out.at(i)->buf.data())[0]; }

int collective_order_spmd(std::shared_ptr<collectives::Transport> t) {
  collectives::Communicator a(t, {0, 1}, 1), b(t, {0, 1}, 2);
  std::vector<float> x(kFloats, 1.f);
  const auto ar = [&](collectives::Communicator& c) {
    c.allreduce(x.data(), x.data(), x.size(), collectives::DataType::kFloat32, collectives::ReduceOp::kSum,
                collectives::Algorithm::kRing);
  };
  if (t->rank() == 0) ar(a), ar(b);
  else ar(b), ar(a);
  return 0;  // (never reached: the watchdog ends the job)
}

int collective_order_static(std::shared_ptr<collectives::Transport> t) {
  dataflow::Builder b("two-collectives");
  auto a = b.call("fill", 0, 2, {}), c = b.call("fill", 1, 2, {});
  b.output(b.call("allreduce", 0, 2, a)[0]);
  b.output(b.call("allreduce", 1, 2, c)[0]);
  const auto out = run_static(t, b.build(), {{0, 1}, {0, 1}});
  PWM_CHECK(first(out, 0) == 3.f && first(out, 1) == 3.f, "wrong sums {} {}", first(out, 0), first(out, 1));
  return 0;
}

int sendrecv_order_static(std::shared_ptr<collectives::Transport> t, bool skip_rank1) {
  dataflow::Builder b("both-ways");
  auto x = b.call("fill", 0, 1, {}), y = b.call("fill", 1, 1, {});
  b.output(b.call("neg", 1, 1, x)[0]);  // stage 0's value to stage 1
  b.output(b.call("neg", 0, 1, y)[0]);  // stage 1's to stage 0
  const auto out = run_static(t, b.build(), {{0}, {1}}, skip_rank1);
  if (t->rank() == 0) PWM_CHECK(first(out, 1) == -2.f, "rank 0 got {}", first(out, 1));
  if (t->rank() == 1 && !skip_rank1) PWM_CHECK(first(out, 0) == -1.f, "rank 1 got {}", first(out, 0));
  return 0;
}

// Pathways: the controller (rank 0) runs the case's programs; the workers serve.
int pathways_case(std::shared_ptr<collectives::Transport> t, bool collectives_case) {
  if (t->rank() != 0) {
    pathways::run_worker(t);
    return 0;
  }
  pathways::Runtime rt(t);
  std::string errors[2];
  if (collectives_case) {
    // Device d is world rank d + 1: the sum of (rank + 1) over the two workers is 2 + 3.
    const auto client = [&](int id) {
      try {
        pathways::Client c = rt.client(fmt::format("client{}", id));
        pathways::Slice s = c.allocate(2);
        pathways::ProgramBuilder b(fmt::format("collective-{}", id));
        b.output(b.call("allreduce", s, b.call("fill", s, {}))[0]);
        const pathways::Program p = b.build();
        for (int rep = 0; rep < 20; ++rep)
          if (const float got = c.run(p, {})[0].get<float>()[0]; got != 5.f) errors[id] = fmt::format("sum {}", got);
      } catch (const std::exception& e) {
        errors[id] = e.what();
      }
    };
    std::thread a(client, 0), b(client, 1);
    a.join();
    b.join();
  } else {
    pathways::Client c = rt.client("both-ways");
    pathways::Slice p0 = c.allocate(1), p1 = c.allocate(1);
    PWM_CHECK(p0.devices() != p1.devices(), "the two one-device slices share a device");
    pathways::ProgramBuilder b("both-ways");
    auto x = b.call("fill", p0, {}), y = b.call("fill", p1, {});
    b.output(b.call("neg", p1, x)[0]);
    b.output(b.call("neg", p0, y)[0]);
    const auto out = c.run(b.build(), {});
    if (out[0].get<float>()[0] + out[1].get<float>()[0] != -5.f) errors[0] = "wrong values";
  }
  rt.shutdown();
  for (const std::string& e : errors) PWM_CHECK(e.empty(), "pathways: {}", e);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  collectives::MpiEnvironment env(&argc, &argv);
  const std::string c = argc > 2 ? argv[1] : "", m = argc > 2 ? argv[2] : "";
  return collectives::run_mpi_main(env, [&] {
    PWM_CHECK(env.size() == (m == "pathways" ? 3 : 2), "deadlock_matrix runs on 2 ranks (pathways: 3)");
    register_kernels();
    int rc = 1;
    if (c == "collective_order" && m == "spmd") rc = collective_order_spmd(env.transport());
    else if (c == "collective_order" && m == "static") rc = collective_order_static(env.transport());
    else if (c == "sendrecv_order" && m == "static") rc = sendrecv_order_static(env.transport(), false);
    else if (c == "missing_peer" && m == "static") rc = sendrecv_order_static(env.transport(), true);
    else if (c == "collective_order" && m == "pathways") rc = pathways_case(env.transport(), true);
    else if (c == "sendrecv_order" && m == "pathways") rc = pathways_case(env.transport(), false);
    else PWM_THROW("usage: deadlock_matrix collective_order spmd|static|pathways | sendrecv_order static|pathways | "
                   "missing_peer static");
    if (env.rank() == 0) fmt::print("deadlock_matrix {} {}: completed\n", c, m);
    return rc;
  });
}
