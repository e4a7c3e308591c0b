// Multi-tenancy under mpirun (linked into pathways_mpi_tests, whose main in test_mpi.cc starts
// the Runtime): several clients with their own slices, programs and objects; isolation;
// reclamation; the island schedulers' shares; back-pressure under a memory cap. Every value is
// checked against a reference computed on the client.
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <random>
#include <thread>

#include "pathways/runtime.h"

namespace pwm::pathways {
namespace testing {
extern Runtime* g_runtime;
}
namespace {

Runtime& rt() { return *testing::g_runtime; }
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
int island_devices() { return rt().num_devices() / rt().num_islands(); }

// Waits until every worker holds nothing (runs already sent may still be finishing).
std::vector<WorkerStats> settled_stats(Client& c) {
  std::vector<WorkerStats> st;
  for (int i = 0; i < 200; ++i) {
    st = c.stats();
    bool idle = true;
    for (auto& s : st) idle = idle && s.runs == 0 && s.waiting_runs == 0 && s.objects == 0 && s.buffers == 0;
    if (idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return st;
}

void expect_empty(const std::vector<WorkerStats>& st) {
  for (auto& s : st) {
    EXPECT_EQ(s.objects, 0u) << "rank " << s.rank;
    EXPECT_EQ(s.buffers, 0u) << "rank " << s.rank;
    EXPECT_EQ(s.programs, 0u) << "rank " << s.rank;
    EXPECT_EQ(s.runs, 0u) << "rank " << s.rank;
  }
}

// ---- 4 clients x 100 random programs with in-kernel collectives on overlapping slices ----
//
// Every client has a slice A over all devices of one island, a slice B over a subset of them
// (>= 2 devices when the island has 3 or more) and a 1-device slice C; the three overlap each
// other and the other clients' slices. A random program chains 1-4 steps on a float32[1,1]
// replicated value: allreduce_add on A or B (x <- |S| x + c: collectives) or scale on C
// (x <- f x: the value moves there and back). Values stay small integers: exact in float.
// With the island ordering off (--ordering off) the same workload deadlocks: see CMakeLists.txt.
TEST(Tenancy, RandomProgramsFourClients) {
  const int kClients = 4, kPrograms = 100;
  const int n = island_devices();
  std::vector<std::string> errors(kClients);
  std::barrier start(kClients);
  auto body = [&](int id) {
    std::string& err = errors[id];
    try {
      Client c = rt().client(fmt::format("tenant{}", id));
      Slice a = c.allocate(n, {}, 0);
      Slice b = c.allocate(n >= 3 ? n - 1 : n, {}, 0);
      Slice s1 = c.allocate(1, {}, 0);
      std::mt19937 rng(1234 + id);
      std::vector<Program> progs;
      std::vector<float> inputs, want;
      for (int p = 0; p < kPrograms; ++p) {
        ProgramBuilder pb(fmt::format("t{}_p{}", id, p));
        Value v = pb.param(a, {{collectives::DataType::kFloat32, {1, 1}}, dataflow::Sharding::kReplicated});
        float x = static_cast<float>(rng() % 5);
        inputs.push_back(x);
        const int steps = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < steps; ++k) {
          const int op = static_cast<int>(rng() % 3);
          const int64_t arg = static_cast<int64_t>(rng() % 3);
          if (op == 2) {
            v = pb.call("scale", s1, {v}, {arg + 1, 1, 1, 1})[0];
            x *= static_cast<float>(arg + 1);
          } else {
            const Slice& s = op == 0 ? a : b;
            v = pb.call("allreduce_add", s, {v}, {arg, 1, 1})[0];
            x = static_cast<float>(s.size()) * x + static_cast<float>(arg);
          }
        }
        pb.output(v);
        progs.push_back(pb.build());
        want.push_back(x);
      }
      start.arrive_and_wait();  // all clients submit at once
      std::vector<Array> outs;
      for (int p = 0; p < kPrograms; ++p) {
        Array in = c.put(a, dataflow::Sharding::kReplicated, {1, 1}, std::vector<float>{inputs[p]});
        outs.push_back(c.run(progs[p], {in})[0]);
      }
      for (int p = 0; p < kPrograms && err.empty(); ++p) {
        const float got = outs[p].get<float>()[0];
        if (got != want[p]) err = fmt::format("client {} program {}: got {}, want {}", id, p, got, want[p]);
      }
    } catch (const std::exception& e) {
      err = fmt::format("client {}: {}", id, e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) threads.emplace_back(body, i);
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_EQ(e, "");
  Client probe = rt().client("probe");
  expect_empty(settled_stats(probe));
}

// ---- isolation ----

TEST(Tenancy, ForeignAndReleasedHandlesAreClearErrorsAndChangeNothing) {
  Client a = rt().client("alice");
  Client b = rt().client("bob");
  Slice sa = a.allocate(island_devices());
  Slice sb = b.allocate(island_devices());
  Array xa = a.put(sa, dataflow::Sharding::kReplicated, {1}, std::vector<float>{2});
  ProgramBuilder pb("alice_prog");
  pb.output(pb.call("allreduce_add", sa, {pb.param_like(xa)}, {1})[0]);
  Program pa = pb.build();
  const float want = static_cast<float>(island_devices()) * 2 + 1;
  EXPECT_EQ(a.run(pa, {xa})[0].get<float>(), std::vector<float>{want});
  auto runs_of = [&](const Client& c) {
    for (auto& u : rt().usage())
      if (u.id == c.id()) return u.runs_dispatched;
    return uint64_t{999};
  };

  auto expect_error = [](auto fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing: " << what;
    } catch (const pwm::Error& e) {
      EXPECT_TRUE(contains(e.what(), what)) << e.what();
    }
  };
  const std::string alice = "belongs to client 'alice'";
  expect_error([&] { b.run(pa, {xa}); }, alice);                                   // her program
  expect_error([&] { b.call("allreduce_add", sb, {xa}, {1}); }, alice);            // her array
  expect_error([&] { b.call("allreduce_add", sa, {}, {1}); }, alice);              // her slice
  expect_error([&] { b.put(sa, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0}); }, alice);
  ProgramBuilder pb2("bob_on_alice_slice");
  pb2.output(pb2.call("iota", sa, {}, {2 * island_devices(), 1})[0]);
  expect_error([&] { b.run(pb2.build(), {}); }, alice);
  // Bob's own program with Alice's array as input.
  ProgramBuilder pb3("bob_prog");
  Array xb = b.put(sb, dataflow::Sharding::kReplicated, {1}, std::vector<float>{5});
  pb3.output(pb3.call("allreduce_add", sb, {pb3.param_like(xb)}, {0})[0]);
  Program p3 = pb3.build();
  expect_error([&] { b.run(p3, {xa}); }, alice);
  EXPECT_EQ(runs_of(b), 0u);
  EXPECT_EQ(b.run(p3, {xb})[0].get<float>(), std::vector<float>{5.0f * island_devices()});

  // Nothing changed for Alice: her value is intact and the stores hold what they held.
  EXPECT_EQ(xa.get<float>(), std::vector<float>{2});
  EXPECT_EQ(runs_of(a), 1u);  // none of Bob's attempts ran anything
  EXPECT_EQ(runs_of(b), 1u);  // his own run only

  // A released handle (and its copies) is an error to use.
  Array copy = xa;
  xa.release();
  EXPECT_TRUE(copy.released());
  expect_error([&] { a.run(pa, {copy}); }, "was released");
  EXPECT_THROW(copy.get<float>(), pwm::Error);
  EXPECT_TRUE(contains(copy.fetch().error(), "was released")) << copy.fetch().error();
  // A disconnected client cannot be used; the other is unaffected.
  a.disconnect();
  EXPECT_FALSE(a.connected());
  expect_error([&] { a.allocate(1); }, "is disconnected");
  expect_error([&] { a.put(sa, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0}); }, "is disconnected");
  EXPECT_EQ(b.run(p3, {xb})[0].get<float>(), std::vector<float>{5.0f * island_devices()});
}

// ---- reclamation ----

TEST(Tenancy, DisconnectedOrFailedClientIsReclaimed) {
  const int n = island_devices();
  // Handles that outlive their client: reclamation must not wait for them.
  std::vector<Array> leaked;
  std::vector<Program> leaked_progs;
  std::thread failing([&] {
    try {
      Client c = rt().client("crashes");
      Slice s = c.allocate(n);
      Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1});
      ProgramBuilder pb("crash_prog");
      pb.output(pb.call("allreduce_add", s, {pb.param_like(x)}, {1})[0]);
      Program p = pb.build();
      for (int i = 0; i < 5; ++i) leaked.push_back(c.run(p, {x})[0]);
      leaked.back().wait();
      leaked.push_back(x);
      leaked_progs.push_back(p);
      throw std::runtime_error("client thread fails");
    } catch (const std::runtime_error&) {
      // the Client was destroyed while unwinding: the runtime reclaims what it owned
    }
  });
  failing.join();
  Client probe = rt().client("probe");
  expect_empty(settled_stats(probe));  // objects freed, programs evicted, although handles remain
  EXPECT_THROW(leaked.back().get<float>(), pwm::Error);  // its object was reclaimed
  leaked.clear();
  leaked_progs.clear();

  // An explicit disconnect while runs are queued: those not yet sent fail, the rest finish and
  // are dropped; nothing is left.
  Client c = rt().client("leaves");
  Slice s = c.allocate(n);
  Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1});
  std::vector<Array> outs;
  for (int i = 0; i < 50; ++i) outs.push_back(c.call("sleep_allreduce", s, {x}, {200})[0]);
  c.disconnect();
  int failed = 0;
  for (auto& o : outs) {
    try {
      o.wait();
    } catch (const pwm::Error& e) {
      failed++;
      EXPECT_TRUE(contains(e.what(), "disconnected")) << e.what();
    }
  }
  // (FIFO sends every run at once, so none fails; proportional share holds most of them back.)
  if (std::string(rt().scheduler_name()) == "share") {
    EXPECT_GT(failed, 0);
  }
  bool listed = false;
  for (auto& u : rt().usage())
    if (u.id == c.id()) {
      listed = true;
      EXPECT_FALSE(u.connected);
    }
  EXPECT_TRUE(listed);
  outs.clear();
  expect_empty(settled_stats(probe));
}

// ---- the island scheduler's shares ----
//
// Four clients on the same slice, with runs of a gang node taking 200 us of device time (asleep,
// not on a core; 200 for the heaviest client), submitted round-robin so that all of them are backlogged from the
// start. When the heaviest client's last run is done, the node-shards of the completed runs of
// each client (counted by the dispatcher) are compared with the weights: proportional share
// must match them within 10%; FIFO gives every client the same share instead.
void check_shares(const std::vector<double>& weights) {
  const int n = island_devices();
  const bool share = std::string(rt().scheduler_name()) == "share";
  std::vector<Client> clients;
  std::vector<Slice> slices;
  std::vector<Array> xs;
  for (size_t i = 0; i < weights.size(); ++i) {
    clients.push_back(rt().client(fmt::format("w{}_{}", weights[i], i), ClientOptions{weights[i]}));
    slices.push_back(clients[i].allocate(n, {}, 0));
    xs.push_back(clients[i].put(slices[i], dataflow::Sharding::kReplicated, {1}, std::vector<float>{1}));
  }
  const double wmax = *std::max_element(weights.begin(), weights.end());
  const size_t heavy = static_cast<size_t>(std::max_element(weights.begin(), weights.end()) - weights.begin());
  // Each client stays backlogged until the heaviest is done (a window's worth of extra runs).
  const int runs_heavy = 200;
  std::vector<int> runs(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) runs[i] = static_cast<int>(runs_heavy * weights[i] / wmax) + 16;
  runs[heavy] = runs_heavy;
  if (!share) std::fill(runs.begin(), runs.end(), runs_heavy);  // FIFO: equal, whatever the weights
  std::vector<std::vector<Array>> outs(weights.size());
  for (int r = 0; r < runs_heavy; ++r)
    for (size_t i = 0; i < weights.size(); ++i)
      if (r < runs[i]) outs[i].push_back(clients[i].call("sleep_allreduce", slices[i], {xs[i]}, {200})[0]);
  outs[heavy].back().wait();
  auto usage = rt().usage();
  std::vector<double> got(weights.size(), 0);
  double total = 0;
  for (auto& u : usage)
    for (size_t i = 0; i < clients.size(); ++i)
      if (u.id == clients[i].id()) {
        got[i] = static_cast<double>(u.node_shards_completed);
        total += got[i];
      }
  double wsum = 0;
  for (double w : weights) wsum += share ? w : 1;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double want = (share ? weights[i] : 1) / wsum, have = got[i] / total;
    EXPECT_NEAR(have, want, 0.1 * want) << rt().scheduler_name() << ": client " << i << " (weight " << weights[i]
                                        << ") got " << got[i] << " of " << total << " node-shards";
  }
  for (size_t i = 0; i < weights.size(); ++i)
    for (auto& o : outs[i]) EXPECT_EQ(o.get<float>(), std::vector<float>{static_cast<float>(n)});
}

TEST(Tenancy, SharesFollowTheWeights) {
  check_shares({1, 1, 1, 1});
  check_shares({1, 2, 4, 8});
}

// ---- back-pressure (run with --memory-cap on the workers) ----
//
// A run of `fill` needs 2 * 8 KiB of buffers per device (iota's output, then scale's) and keeps
// 8 KiB as its output. Under a 64 KiB cap, holding ten outputs cannot fit: the later runs wait
// on the workers, and complete once the client releases earlier outputs.
TEST(Tenancy, BackPressureWaitsForMemoryAndCompletes) {
  const uint64_t cap = rt().memory_cap_bytes();
  if (cap == 0) GTEST_SKIP() << "no --memory-cap on the workers";
  Client c = rt().client("bp");
  const int n = island_devices();
  Slice s = c.allocate(n);
  const int64_t rows = 64 * n, cols = 32;  // 8 KiB per shard
  ProgramBuilder pb("fill");
  pb.output(pb.call("scale", s, {pb.call("iota", s, {}, {rows, cols})[0]}, {2, rows, cols, 0})[0]);
  Program fill = pb.build();
  std::vector<float> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) want[r * cols + k] = 2.0f * static_cast<float>(1000 * r + k);
  // 1. More outputs held than fit: the tail waits, then completes as the head is released.
  const int held = static_cast<int>(cap / (8 << 10)) + 2;
  std::vector<Array> outs;
  for (int i = 0; i < held; ++i) outs.push_back(c.run(fill, {})[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(outs.back().ready());
  uint64_t waiting = 0;
  for (auto& st : c.stats()) waiting += st.waiting_runs;
  EXPECT_GT(waiting, 0u);
  for (auto& o : outs) {
    EXPECT_EQ(o.get<float>(), want);
    o.release();
  }
  outs.clear();
  // 2. A stream of 60 runs, each output fetched then dropped: completes within the cap.
  for (int i = 0; i < 60; ++i) {
    outs.push_back(c.run(fill, {})[0]);
    if (outs.size() > 4) {
      EXPECT_EQ(outs.front().get<float>(), want);
      outs.erase(outs.begin());
    }
  }
  for (auto& o : outs) EXPECT_EQ(o.get<float>(), want);
  outs.clear();
  for (auto& st : c.stats()) EXPECT_LE(st.peak_bytes, cap) << "rank " << st.rank;
  // 3. What could never fit is an error, not a wait.
  const int64_t big = static_cast<int64_t>(cap / 4 + 16) * n;  // more than the cap per shard
  ProgramBuilder pb2("too_big");
  pb2.output(pb2.call("iota", s, {}, {big, 1})[0]);
  Array y = c.run(pb2.build(), {})[0];
  EXPECT_THROW(y.wait(), pwm::Error);
  EXPECT_TRUE(contains(y.error(), "could never run")) << y.error();
  std::vector<float> huge(static_cast<size_t>(cap / 4 + 16) * n, 1.0f);
  Array z = c.put(s, dataflow::Sharding::kSplit, {static_cast<int64_t>(huge.size())}, huge);
  EXPECT_THROW(z.wait(), pwm::Error);
  EXPECT_TRUE(contains(z.error(), "could never fit")) << z.error();
  fill = Program();
  expect_empty(settled_stats(c));
}

}  // namespace
}  // namespace pwm::pathways
