// The Pathways runtime under mpirun: world rank 0 runs the tests as the controller's client,
// every other rank is a worker (run_worker). Every value is checked against an independent
// computation on the client. Run at 3 ranks (2 workers) and 5 ranks (4 workers, --islands 2x2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "collectives/mpi_transport.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "tests/pathways/test_kernels.h"

namespace pwm::pathways {
namespace testing {
Runtime* g_runtime = nullptr;  // shared with test_tenancy.cc
}
namespace {

Runtime*& g_rt = testing::g_runtime;
std::string g_islands;

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// The logical tensor iota writes: 1000 * row + col.
std::vector<float> iota_ref(int64_t rows, int64_t cols, float factor = 1) {
  std::vector<float> v(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = factor * static_cast<float>(1000 * r + c);
  return v;
}

// allreduce_add on N replicas, `steps` times: x <- N x + c.
float chain_ref(float x, int n, float c, int steps) {
  for (int i = 0; i < steps; ++i) {
    float s = 0;
    for (int k = 0; k < n; ++k) s += x;
    x = s + c;
  }
  return x;
}

// The widest slice: all devices, or one island's.
int workers() { return g_rt->num_devices() / g_rt->num_islands(); }

TEST(Pathways, PutFetchRoundTrip) {
  Client c = g_rt->client("put");
  Slice s = c.allocate(workers());
  std::vector<float> v(4 * workers());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i);
  Array split = c.put(s, dataflow::Sharding::kSplit, {static_cast<int64_t>(v.size())}, v);
  Array rep = c.put(s, dataflow::Sharding::kReplicated, {static_cast<int64_t>(v.size())}, v);
  EXPECT_EQ(split.get<float>(), v);
  EXPECT_EQ(rep.get<float>(), v);
  EXPECT_EQ(split.spec().shard.shape[0], 4);
}

TEST(Pathways, OpByOpChainedAndFusedAgreeWithReference) {
  Client c = g_rt->client("chain");
  const int n = workers(), steps = 12;
  Slice s = c.allocate(n);
  Array x0 = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1.0f});
  const float want = chain_ref(1.0f, n, 1.0f, steps);
  // OpByOp: one program per call, each call's output the next call's input (a future).
  Array x = x0;
  for (int i = 0; i < steps; ++i) x = c.call("allreduce_add", s, {x}, {1})[0];
  EXPECT_EQ(x.get<float>(), std::vector<float>{want});
  // Chained: one traced program of `steps` nodes.
  ProgramBuilder b("chain");
  Value v = b.param_like(x0);
  for (int i = 0; i < steps; ++i) v = b.call("allreduce_add", s, {v}, {1})[0];
  b.output(v);
  Program p = b.build();
  ASSERT_EQ(p.error(), "");
  EXPECT_EQ(c.run(p, {x0})[0].get<float>(), std::vector<float>{want});
  // Fused: one kernel doing every step.
  EXPECT_EQ(c.call("chain_fused", s, {x0}, {steps, 1, 1})[0].get<float>(), std::vector<float>{want});
}

TEST(Pathways, CrossSliceTransfersMtoN) {
  Client c = g_rt->client("xfer");
  const int n = workers();
  const int64_t rows = 12, cols = 3;  // divisible by 1..4
  std::vector<Slice> slices;
  for (int k = 1; k <= n; ++k) slices.push_back(c.allocate(k));
  for (int m = 1; m <= n; ++m) {
    for (int k = 1; k <= n; ++k) {
      if (rows % m || rows % k) continue;
      const Slice& a = slices[m - 1];
      const Slice& b = slices[k - 1];
      ProgramBuilder pb(fmt::format("xfer_{}_{}", m, k));
      Value x = pb.call("iota", a, {}, {rows, cols})[0];
      Value split = pb.call("scale", b, {x}, {2, rows, cols, 0})[0];     // M split -> N split
      Value rep = pb.call("scale", b, {x}, {3, rows, cols, 1})[0];       // M split -> N replicated
      Value back = pb.call("scale", a, {rep}, {5, rows, cols, 0})[0];    // N replicated -> M split
      Value sum = pb.call("add2", b, {split, back}, {rows, cols, 0})[0]; // two inputs, one resharded
      pb.output(split);
      pb.output(rep);
      pb.output(sum);
      Program p = pb.build();
      ASSERT_EQ(p.error(), "");
      auto out = c.run(p, {});
      EXPECT_EQ(out[0].get<float>(), iota_ref(rows, cols, 2)) << m << " -> " << k;
      EXPECT_EQ(out[1].get<float>(), iota_ref(rows, cols, 3)) << m << " -> " << k;
      EXPECT_EQ(out[2].get<float>(), iota_ref(rows, cols, 17)) << m << " -> " << k;
    }
  }
}

TEST(Pathways, CachedProgramThousandRunsThenNothingLeft) {
  {
    Client c = g_rt->client("cached");
    const int n = workers();
    Slice a = c.allocate(n);
    Slice b = c.allocate(1);
    ProgramBuilder pb("cached");
    Value x = pb.param(a, {{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated});
    Value y = pb.call("allreduce_add", a, {x}, {1})[0];
    Value z = pb.call("scale", b, {pb.call("iota", a, {}, {4 * n, 1})[0]}, {2, 4 * n, 1, 1})[0];
    pb.output(y);
    pb.output(z);
    Program p = pb.build();
    std::vector<Array> keep;
    for (int i = 0; i < 1000; ++i) {
      Array in = c.put(a, dataflow::Sharding::kReplicated, {1}, std::vector<float>{static_cast<float>(i % 7)});
      auto out = c.run(p, {in});
      keep.push_back(out[0]);
      if (i % 97 == 0) keep.push_back(out[1]);
      if (keep.size() > 64) {  // check as we go, bounded memory
        for (auto& k : keep) k.wait();
        keep.clear();
      }
      if (i % 250 == 0) {
        EXPECT_EQ(out[0].get<float>(), std::vector<float>{chain_ref(static_cast<float>(i % 7), n, 1, 1)});
        EXPECT_EQ(out[1].get<float>(), iota_ref(4 * n, 1, 2));
      }
    }
    for (auto& k : keep) EXPECT_TRUE((k.wait(), k.ok()));
  }
  // Everything above is dropped: every worker's store and buffers are empty.
  Client c = g_rt->client("stats");
  for (auto& s : c.stats()) {
    EXPECT_EQ(s.objects, 0u) << "rank " << s.rank;
    EXPECT_EQ(s.buffers, 0u) << "rank " << s.rank;
    EXPECT_EQ(s.runs, 0u) << "rank " << s.rank;
  }
}

// A pipeline over 1-device slices alternating between the workers, plus a collective stage.
Program pipeline(Client& c, std::vector<Slice>& keep, int stages, int64_t rows) {
  const int n = workers();
  for (int i = 0; i < n; ++i) keep.push_back(c.allocate(1));
  keep.push_back(c.allocate(n));
  ProgramBuilder pb("pipeline");
  Value x = pb.call("iota", keep[0], {}, {rows, 2})[0];
  for (int i = 1; i <= stages; ++i) x = pb.call("scale", keep[i % n], {x}, {i % 3 + 1, rows, 2, 0})[0];
  Value y = pb.call("scale", keep[n], {x}, {1, rows, 2, 1})[0];
  pb.output(x);
  pb.output(y);
  return pb.build();
}

TEST(Pathways, ParallelAndSequentialDispatchAgree) {
  Client c = g_rt->client("dispatch");
  std::vector<Slice> keep;
  const int stages = 9;
  Program p = pipeline(c, keep, stages, 8);
  float f = 1;
  for (int i = 1; i <= stages; ++i) f *= static_cast<float>(i % 3 + 1);
  auto par = c.run(p, {});
  RunOptions seq;
  seq.sequential = true;
  auto sq = c.run(p, {}, seq);
  EXPECT_EQ(par[0].get<float>(), iota_ref(8, 2, f));
  EXPECT_EQ(sq[0].get<float>(), par[0].get<float>());
  EXPECT_EQ(sq[1].get<float>(), par[1].get<float>());
}

TEST(Pathways, KernelThatThrowsFailsTheFutureAndTheRuntimeContinues) {
  Client c = g_rt->client("errors");
  Slice s = c.allocate(workers());
  Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{3});
  for (int64_t who : {-1, 0}) {
    Array y = c.call("boom", s, {x}, {who})[0];
    EXPECT_THROW(y.wait(), pwm::Error);
    EXPECT_TRUE(contains(y.error(), "kernel 'boom'")) << y.error();
    // Every shard throws when who = -1; the first report to arrive is the one shown.
    const std::string cause = who < 0 ? "boom on shard" : "boom on shard 0";
    EXPECT_TRUE(contains(y.error(), cause)) << y.error();
    EXPECT_TRUE(contains(y.error(), "device")) << y.error();
    // What depends on it fails too, naming the cause.
    Array z = c.call("allreduce_add", s, {y}, {1})[0];
    EXPECT_THROW(z.wait(), pwm::Error);
    EXPECT_TRUE(contains(z.error(), cause)) << z.error();
    EXPECT_THROW(z.get<float>(), pwm::Error);
  }
  // The runtime keeps running.
  EXPECT_EQ(c.call("allreduce_add", s, {x}, {1})[0].get<float>(), std::vector<float>{chain_ref(3, workers(), 1, 1)});
}

TEST(Pathways, UnknownKernelAndWrongShapeFailTheFuture) {
  Client c = g_rt->client("errors2");
  Slice s = c.allocate(workers());
  Array x = c.put(s, dataflow::Sharding::kReplicated, {2}, std::vector<float>{1, 2});
  ProgramBuilder pb("unknown");
  Value v = pb.param_like(x);
  auto outs = pb.call("no_such_kernel", s, {v});
  EXPECT_TRUE(outs.empty());
  pb.output(v);
  auto r = c.run(pb.build(), {x});
  EXPECT_THROW(r[0].wait(), pwm::Error);
  EXPECT_TRUE(contains(r[0].error(), "unknown kernel 'no_such_kernel'")) << r[0].error();
  // allreduce_add with n = 1 expects float32[1]; x is float32[2].
  Array w = c.call("allreduce_add", s, {x}, {1, 1})[0];
  EXPECT_THROW(w.wait(), pwm::Error);
  EXPECT_TRUE(contains(w.error(), "wrong shape")) << w.error();
  // A program run with an input of the wrong shape.
  ProgramBuilder pb2("shape");
  Value p2 = pb2.param(s, {{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated});
  pb2.output(pb2.call("allreduce_add", s, {p2}, {1})[0]);
  auto r2 = c.run(pb2.build(), {x});
  EXPECT_THROW(r2[0].wait(), pwm::Error);
  EXPECT_TRUE(contains(r2[0].error(), "wrong shape")) << r2[0].error();
  EXPECT_EQ(c.call("allreduce_add", s, {x}, {0, 2})[0].get<float>(),
            (std::vector<float>{chain_ref(1, workers(), 0, 1), chain_ref(2, workers(), 0, 1)}));
}

TEST(Pathways, MissedDeadlineNamesTheDeviceAndNode) {
  Client c = g_rt->client("deadline");
  Slice a = c.allocate(1);
  Slice b = c.allocate(1);
  Array x = c.put(a, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1});
  ProgramBuilder pb("stuck");
  Value v = pb.call("sleep_ms", a, {pb.param_like(x)}, {1500})[0];
  pb.output(pb.call("sleep_ms", b, {v}, {0})[0]);
  RunOptions o;
  o.deadline_s = 0.3;
  auto r = c.run(pb.build(), {x}, o);
  EXPECT_THROW(r[0].wait(), pwm::Error);
  const std::string e = r[0].error();
  EXPECT_TRUE(contains(e, "missed its deadline of 0.30 s")) << e;
  EXPECT_TRUE(contains(e, fmt::format("device {} (world rank {}) is stuck in node 0 'sleep_ms'", a.devices()[0],
                                      a.devices()[0] + 1))) << e;
  if (b.devices()[0] != a.devices()[0]) {
    EXPECT_TRUE(contains(e, fmt::format("device {} (world rank {}) is waiting to start node 1 'sleep_ms'", b.devices()[0],
                                        b.devices()[0] + 1))) << e;
  }
  // Without a deadline the same program completes.
  ProgramBuilder pb2("slow");
  pb2.output(pb2.call("sleep_ms", a, {pb2.param_like(x)}, {10})[0]);
  EXPECT_EQ(c.run(pb2.build(), {x})[0].get<float>(), std::vector<float>{1});
}

TEST(Pathways, DrainedDeviceProgramsRunAfterRemap) {
  Client c = g_rt->client("drain");
  Slice s = c.allocate(1);
  const int before = s.devices()[0];
  Array x = c.put(s, dataflow::Sharding::kSplit, {6, 1}, std::vector<float>{1, 2, 3, 4, 5, 6});
  ProgramBuilder pb("drained");
  pb.output(pb.call("scale", s, {pb.param_like(x)}, {4, 6, 1, 0})[0]);
  Program p = pb.build();
  Array y1 = c.run(p, {x})[0];
  const std::vector<float> want{4, 8, 12, 16, 20, 24};
  EXPECT_EQ(y1.get<float>(), want);
  c.drain(before);
  const int after = s.devices()[0];
  EXPECT_NE(after, before);
  EXPECT_EQ(c.run(p, {x})[0].get<float>(), want);  // lowered again, input migrated
  EXPECT_EQ(y1.get<float>(), want);                // an old output migrated too
  Slice t = c.allocate(1);
  EXPECT_NE(t.devices()[0], before);               // drained devices get no new slices
  c.undrain(before);
  if (workers() >= 3) {
    Slice w = c.allocate(2);
    Array z = c.put(w, dataflow::Sharding::kSplit, {4, 1}, std::vector<float>{1, 2, 3, 4});
    ProgramBuilder pb2("drained2");
    Value rep = pb2.call("scale", w, {pb2.param_like(z)}, {1, 4, 1, 1})[0];  // split -> replicated
    pb2.output(pb2.call("allreduce_add", w, {rep}, {0, 4, 1})[0]);
    Program p2 = pb2.build();
    EXPECT_EQ(c.run(p2, {z})[0].get<float>(), (std::vector<float>{2, 4, 6, 8}));
    const int d = w.devices()[1];
    c.drain(d);
    EXPECT_EQ(c.run(p2, {z})[0].get<float>(), (std::vector<float>{2, 4, 6, 8}));
    c.undrain(d);
  }
}

TEST(Pathways, ConcurrentClientsOnOverlappingSlices) {
  // Two client threads run collective chains on slices that share devices; the island
  // scheduler's one order keeps them from deadlocking.
  auto body = [](int id, int n, std::string* err) {
    try {
      Client c = g_rt->client(fmt::format("thread{}", id));
      Slice s = c.allocate(n);
      Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{static_cast<float>(id)});
      for (int rep = 0; rep < 5; ++rep) {
        Array y = x;
        for (int i = 0; i < 8; ++i) y = c.call("allreduce_add", s, {y}, {id + 1})[0];
        float got = y.get<float>()[0], want = chain_ref(static_cast<float>(id), n, static_cast<float>(id + 1), 8);
        if (got != want) *err = fmt::format("client {}: {} != {}", id, got, want);
      }
    } catch (const std::exception& e) {
      *err = e.what();
    }
  };
  std::string e1, e2;
  std::thread t1(body, 1, workers(), &e1), t2(body, 2, std::max(1, workers() - 1), &e2);
  t1.join();
  t2.join();
  EXPECT_EQ(e1, "");
  EXPECT_EQ(e2, "");
}

TEST(Pathways, DataDependentControlFlowInClientCode) {
  // Double until the value passes 100, deciding on the client after each fetch.
  Client c = g_rt->client("control");
  Slice s = c.allocate(workers());
  Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1});
  int iters = 0;
  float host = 1;
  while (host <= 100) {
    x = c.call("allreduce_add", s, {x}, {0})[0];
    host = x.get<float>()[0];
    ++iters;
  }
  int want = 0;
  for (float h = 1; h <= 100; h = chain_ref(h, workers(), 0, 1)) ++want;
  EXPECT_EQ(iters, want);
}

TEST(Pathways, AskingForTooManyDevicesIsAClearError) {
  Client c = g_rt->client("rm");
  try {
    c.allocate(g_rt->num_devices() + 1);
    FAIL() << "allocate succeeded";
  } catch (const pwm::Error& e) {
    EXPECT_TRUE(contains(e.what(), fmt::format("asked for {} devices but there are only {}", g_rt->num_devices() + 1,
                                               g_rt->num_devices())))
        << e.what();
  }
  if (!g_islands.empty()) {
    // With islands of 2, a slice of 3 cannot be placed although 4 devices exist.
    EXPECT_THROW(c.allocate(3), pwm::Error);
    Slice a = c.allocate(2, {}, 0), b = c.allocate(2, {}, 1);
    EXPECT_EQ(a.island(), 0);
    EXPECT_EQ(b.island(), 1);
    // Data between islands moves worker to worker.
    ProgramBuilder pb("islands");
    Value v = pb.call("iota", a, {}, {4, 1})[0];
    pb.output(pb.call("scale", b, {v}, {3, 4, 1, 0})[0]);
    EXPECT_EQ(c.run(pb.build(), {})[0].get<float>(), iota_ref(4, 1, 3));
  }
}

}  // namespace
}  // namespace pwm::pathways

int main(int argc, char** argv) {
  pwm::collectives::MpiEnvironment env(&argc, &argv);
  return pwm::collectives::run_mpi_main(env, [&] {
    pwm::pathways::testing::register_test_kernels();
    ::testing::InitGoogleTest(&argc, argv);
    // --islands KxM, --scheduler fifo|share, --ordering off, --memory-cap BYTES (every worker).
    pwm::pathways::RuntimeOptions o = pwm::pathways::RuntimeOptions::from_env();
    pwm::pathways::WorkerOptions wo = pwm::pathways::WorkerOptions::from_env();
    for (int i = 1; i + 1 < argc; ++i) {
      const std::string a = argv[i], v = argv[i + 1];
      if (a == "--islands") o.islands = v;
      if (a == "--scheduler") o.scheduler = pwm::pathways::scheduler_by_name(v);
      if (a == "--ordering") o.island_ordering = v != "off";
      if (a == "--memory-cap") wo.memory_cap_bytes = std::stoull(v);
    }
    if (env.rank() != 0) {
      pwm::pathways::run_worker(env.transport(), wo);
      return 0;
    }
    pwm::pathways::g_islands = o.islands;
    pwm::pathways::Runtime rt(env.transport(), o);
    pwm::pathways::g_rt = &rt;
    int rc = RUN_ALL_TESTS();
    rt.shutdown();
    return rc;
  });
}
