// In-process tests of the runtime's parts: resource manager, program checks, lowering, the
// framed channel, and the whole runtime with ranks as threads (InProcFabric).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "collectives/inproc_transport.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/messages.h"
#include "pathways/object_store.h"
#include "pathways/resource_manager.h"
#include "pathways/runtime.h"
#include "pathways/worker.h"
#include "tests/pathways/test_kernels.h"

namespace pwm::pathways {
namespace {

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

TEST(ResourceManager, IslandsByHostAndBySpec) {
  ResourceManager by_host({"a", "a", "b", "b", "b"}, "");
  EXPECT_EQ(by_host.num_islands(), 2);
  EXPECT_EQ(by_host.devices()[4].island, 1);
  ResourceManager spec({"h", "h", "h", "h"}, "2x2");
  EXPECT_EQ(spec.num_islands(), 2);
  EXPECT_EQ(spec.devices()[1].island, 0);
  EXPECT_EQ(spec.devices()[2].island, 1);
  EXPECT_THROW(ResourceManager({"h", "h", "h"}, "2x2"), pwm::Error);
  EXPECT_THROW(ResourceManager({"h"}, "two"), pwm::Error);
}

TEST(ResourceManager, AllocateSpreadsLoadAndReleases) {
  ResourceManager rm({"h", "h", "h", "h"}, "");
  SliceInfo a = rm.allocate(2);
  SliceInfo b = rm.allocate(2);
  EXPECT_EQ(a.devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.devices, (std::vector<int>{2, 3}));  // the least loaded devices
  EXPECT_NE(a.context, b.context);
  EXPECT_EQ(a.world_ranks(), (std::vector<int>{1, 2}));
  SliceInfo c = rm.allocate(4, {2, 2});
  EXPECT_EQ(c.mesh, (std::vector<int>{2, 2}));
  rm.release(a.id);
  EXPECT_EQ(rm.allocate(1).devices, (std::vector<int>{0}));
  EXPECT_THROW(rm.allocate(4, {3}), pwm::Error);
  try {
    rm.allocate(5);
    FAIL();
  } catch (const pwm::Error& e) {
    EXPECT_TRUE(contains(e.what(), "asked for 5 devices but there are only 4")) << e.what();
  }
  ResourceManager isl({"h", "h", "h", "h"}, "2x2");
  try {
    isl.allocate(3);
    FAIL();
  } catch (const pwm::Error& e) {
    EXPECT_TRUE(contains(e.what(), "largest island has 2")) << e.what();
  }
  EXPECT_EQ(isl.allocate(2, {}, 1).devices, (std::vector<int>{2, 3}));
}

TEST(ResourceManager, DrainRemapsWithinTheIsland) {
  ResourceManager rm({"h", "h", "h", "h"}, "2x2");
  SliceInfo a = rm.allocate(1, {}, 0);
  ASSERT_EQ(a.devices, (std::vector<int>{0}));
  auto plan = rm.drain(0);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].to_device, 1);
  SliceInfo a2 = rm.slice(a.id);
  EXPECT_EQ(a2.devices, (std::vector<int>{1}));
  EXPECT_EQ(a2.generation, a.generation + 1);
  EXPECT_NE(a2.context, a.context);
  // No spare device left in island 0 for a 2-device slice: the drain fails and changes nothing.
  rm.undrain(0);
  SliceInfo b = rm.allocate(2, {}, 0);
  EXPECT_THROW(rm.drain(1), pwm::Error);
  EXPECT_EQ(rm.slice(b.id).generation, b.generation);
  EXPECT_FALSE(rm.devices()[1].drained);
}

// RuntimeOptions::survive_without_spare: an idle device takes a lost device's slice; with none
// left, the slice is orphaned rather than put beside another slice, whose device's next loss
// would take both (two replicas on one device); the plain drain still doubles up.
TEST(ResourceManager, DrainKeepsOrphansRatherThanDoublingUp) {
  ResourceManager rm({"h", "h", "h"}, "1x3");
  SliceInfo a = rm.allocate(1, {}, 0), b = rm.allocate(1, {}, 0);
  ASSERT_EQ(a.devices, (std::vector<int>{0}));
  ASSERT_EQ(b.devices, (std::vector<int>{1}));
  auto plan = rm.drain(0, /*keep_orphans=*/true);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].to_device, 2);  // the idle one
  EXPECT_FALSE(rm.orphaned(a.id));
  plan = rm.drain(2, true);  // only device 1 is healthy, and it holds b
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].to_device, -1);
  EXPECT_TRUE(rm.orphaned(a.id));
  EXPECT_EQ(rm.slice(a.id).devices, (std::vector<int>{2}));
  EXPECT_FALSE(rm.orphaned(b.id));
  EXPECT_EQ(rm.slice(b.id).devices, (std::vector<int>{1}));
  // Without keep_orphans the same drain doubles up on device 1.
  ResourceManager plain({"h", "h", "h"}, "1x3");
  SliceInfo c = plain.allocate(1, {}, 0), d = plain.allocate(1, {}, 0);
  plain.drain(0);
  plain.drain(2);
  EXPECT_EQ(plain.slice(c.id).devices, (std::vector<int>{1}));
  EXPECT_EQ(plain.slice(d.id).devices, (std::vector<int>{1}));
}

TEST(ResourceManager, ARetiredContextReturnsOnlyOnceReclaimed) {
  // Collectives abandoned on it left messages that its tags would still match (docs/collectives.md).
  ResourceManager rm({"h", "h", "h", "h"}, "1x4");
  SliceInfo a = rm.allocate(3, {3}, 0);
  const uint32_t old = a.context;
  rm.drain(a.devices[1]);
  const uint32_t moved = rm.slice(a.id).context;
  EXPECT_NE(moved, old);
  auto hand_out = [](ResourceManager& m, int n, int island) {
    std::set<uint32_t> seen;  // every free block, several times over (the manager hands them out in turn)
    for (int i = 0; i < 3000; ++i) {
      SliceInfo s = m.allocate(n, {}, island);
      seen.insert(s.context);
      m.release(s.id);
    }
    return seen;
  };
  std::set<uint32_t> seen = hand_out(rm, 1, 0);
  EXPECT_FALSE(seen.count(old)) << "context " << old << " of the remapped slice was handed out before it was reclaimed";
  EXPECT_FALSE(seen.count(moved));  // (in use)
  EXPECT_GT(seen.size(), 170u);     // (the others were: 899 contexts in blocks of 5)
  // The dispatcher takes it once, with the devices that used it, and reclaims it: it is free again.
  EXPECT_EQ(rm.retired(), 1u);
  auto taken = rm.take_retired();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].context, old);
  EXPECT_EQ(taken[0].devices, a.devices);
  EXPECT_TRUE(rm.take_retired().empty());
  rm.reclaim(old, {});
  EXPECT_EQ(rm.retired(), 0u);
  EXPECT_TRUE(hand_out(rm, 1, 0).count(old));
  EXPECT_THROW(rm.reclaim(old, {}), pwm::Error);  // (not retired)

  // An orphaned slice's context is retired when it is released; reclaimed without device 0 (lost),
  // it serves groups without device 0 only.
  ResourceManager rm2({"h", "h"}, "1x2");
  SliceInfo b = rm2.allocate(2, {2}, 0);
  rm2.drain(b.devices[0], /*keep_orphans=*/true);
  ASSERT_TRUE(rm2.orphaned(b.id));
  const uint32_t orphan = rm2.slice(b.id).context;
  rm2.release(b.id);
  rm2.undrain(0);
  EXPECT_FALSE(hand_out(rm2, 1, 0).count(orphan));
  taken = rm2.take_retired();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].context, orphan);
  rm2.reclaim(orphan, {0});
  EXPECT_FALSE(hand_out(rm2, 2, 0).count(orphan)) << "a block barred for device 0 served a slice on it";
  SliceInfo on0 = rm2.allocate(1, {}, 0);  // (held: the next one-device slices go to device 1)
  ASSERT_EQ(on0.devices, std::vector<int>{0});
  EXPECT_TRUE(hand_out(rm2, 1, 0).count(orphan));

  // renew_context (a slice of a run cancelled after a loss): a fresh block, the old one retired,
  // a new generation. Reclaimed after each, any number of renewals go on; without the reclaims,
  // one line says that none is left.
  ResourceManager rm3({"h", "h"}, "1x2");
  SliceInfo c = rm3.allocate(2, {2}, 0);
  const uint32_t before = c.context;
  rm3.renew_context(c.id);
  EXPECT_NE(rm3.slice(c.id).context, before);
  EXPECT_EQ((rm3.slice(c.id).context - 1) % dataflow::kSliceContextStride, 0u);  // (a block's first)
  EXPECT_EQ(rm3.generation(c.id), c.generation + 1);
  for (int i = 0; i < 1000; ++i) {
    for (const auto& t : rm3.take_retired()) rm3.reclaim(t.context, {});
    rm3.renew_context(c.id);
  }
  EXPECT_EQ(rm3.generation(c.id), c.generation + 1001);
  for (const auto& t : rm3.take_retired()) rm3.reclaim(t.context, {});
  try {
    for (int i = 0; i < 200; ++i) rm3.renew_context(c.id);
    ADD_FAILURE() << "200 renewals of one slice without a reclaim did not run out of the 179 blocks";
  } catch (const pwm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no collectives context left for devices [0,1]: 1 live slices, 178 contexts "
                                         "retired after losses and not yet reclaimed"),
              std::string::npos)
        << e.what();
  }
}

class ProgramTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::register_test_kernels(); }
  static dataflow::ArgSpec rep1() { return {{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated}; }
};

TEST_F(ProgramTest, ChecksKernelsAndShapes) {
  dataflow::ProgramDef d;
  d.name = "p";
  int x = d.add_param(1, 2, rep1());
  d.add_call(dataflow::KernelRegistry::global(), "allreduce_add", 1, 2, {{-1, x}}, {1});
  EXPECT_EQ(d.error, "");
  d.add_call(dataflow::KernelRegistry::global(), "nope", 1, 2, {{-1, x}}, {});
  EXPECT_TRUE(contains(d.error, "unknown kernel 'nope'")) << d.error;
  dataflow::ProgramDef e;
  e.name = "q";
  int y = e.add_param(1, 2, {{collectives::DataType::kFloat32, {2}}, dataflow::Sharding::kReplicated});
  e.add_call(dataflow::KernelRegistry::global(), "allreduce_add", 1, 2, {{-1, y}}, {1});
  EXPECT_TRUE(contains(e.error, "wrong shape")) << e.error;
}

dataflow::SliceLookup two_slices() {
  return [](int id) {
    if (id == 1) return dataflow::SliceMapping{{1, 2}, 5, 0, 0};    // 2 devices
    if (id == 2) return dataflow::SliceMapping{{1, 2, 3}, 6, 0, 0}; // 3 devices, overlapping
    return dataflow::SliceMapping{{3}, 7, 0, 0};
  };
}

TEST_F(ProgramTest, SameSliceEdgesAreNotCopied) {
  dataflow::ProgramDef d;
  d.name = "same";
  int x = d.add_param(1, 2, rep1());
  int a = d.add_call(dataflow::KernelRegistry::global(), "allreduce_add", 1, 2, {{-1, x}}, {1});
  d.add_call(dataflow::KernelRegistry::global(), "allreduce_add", 1, 2, {{a, 0}}, {1});
  d.outputs = {{1, 0}};
  dataflow::LoweredProgram lp = dataflow::lower(d, 9, two_slices());
  EXPECT_EQ(lp.transfers, 0u);
  ASSERT_EQ(lp.workers.size(), 2u);
  const dataflow::WorkerProgram& w = lp.workers.at(1);
  ASSERT_EQ(w.instrs.size(), 2u);
  EXPECT_EQ(w.execs[1].ins[0], w.execs[0].outs[0]);  // reads the producer's slot
  EXPECT_EQ(w.execs[0].group, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(w.execs[0].context, 5u);
}

TEST_F(ProgramTest, ReshardMtoNPlansPieces) {
  // iota [6,1] split over 2 devices (ranks 1,2) -> scale split over 3 (ranks 1,2,3):
  // rows 0-2 on rank 1, 3-5 on rank 2 -> rows 0-1 rank 1, 2-3 rank 2, 4-5 rank 3.
  dataflow::ProgramDef d;
  d.name = "m2n";
  int a = d.add_call(dataflow::KernelRegistry::global(), "iota", 1, 2, {}, {6, 1});
  d.add_call(dataflow::KernelRegistry::global(), "scale", 2, 3, {{a, 0}}, {2, 6, 1, 0});
  ASSERT_EQ(d.error, "");
  d.outputs = {{1, 0}};
  dataflow::LoweredProgram lp = dataflow::lower(d, 9, two_slices());
  // Pieces: rank1 rows0-1 local copy; row2 rank1->rank2; row3 local copy on rank2; rows4-5 rank2->rank3.
  EXPECT_EQ(lp.transfers, 2u);
  int copies = 0, sends = 0, recvs = 0;
  for (auto& [r, w] : lp.workers)
    for (auto& in : w.instrs) {
      copies += in.op == dataflow::Op::kCopy;
      sends += in.op == dataflow::Op::kSend;
      recvs += in.op == dataflow::Op::kRecv;
      if (in.op == dataflow::Op::kSend && r == 2) {
        EXPECT_EQ(in.bytes, 8u);  // two rows of one float
      }
    }
  EXPECT_EQ(copies, 2);
  EXPECT_EQ(sends, 2);
  EXPECT_EQ(recvs, 2);
  EXPECT_EQ(lp.stage_ranks[1], (std::set<int>{1, 2, 3}));
  // The worker program survives the wire.
  Writer w;
  LoadProgram{lp.workers.at(2)}.write(w);
  auto bytes = w.take();
  Reader r(bytes);
  dataflow::WorkerProgram back = LoadProgram::read(r);
  EXPECT_EQ(back.instrs.size(), lp.workers.at(2).instrs.size());
  EXPECT_EQ(back.execs[0].kernel, "iota");
  EXPECT_EQ(back.slots, lp.workers.at(2).slots);
}

TEST(Channel, BundlesAndLargeFrames) {
  collectives::run_inproc(2, [](int rank, std::shared_ptr<collectives::Transport> t) {
    Channel ch(*t);
    ch.listen(1 - rank);
    std::vector<uint8_t> big(100000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
    if (rank == 0) {
      ch.post(1, MsgType::kStats, {1, 2, 3});
      ch.post(1, MsgType::kPut, big);
      ch.flush();
      ch.post(1, MsgType::kFree, {});
      ch.close(1);
    }
    std::vector<Message> got;
    while ((rank == 1 && got.size() < 3) || ch.sends_in_flight() > 0) ch.progress(got);
    if (rank == 1) {
      ASSERT_EQ(got.size(), 3u);
      EXPECT_EQ(got[0].type, MsgType::kStats);
      EXPECT_EQ(got[0].body, (std::vector<uint8_t>{1, 2, 3}));
      EXPECT_EQ(got[1].body, big);
      EXPECT_EQ(got[2].type, MsgType::kFree);
      EXPECT_FALSE(ch.listening(0));  // the final frame ends the listening
      ch.close(0);
      while (ch.sends_in_flight() > 0) ch.progress(got);
    } else {
      while (ch.listening(1)) ch.progress(got);
    }
  });
}

TEST(InProcRuntime, ChainedProgramOverThreads) {
  testing::register_test_kernels();
  collectives::run_inproc(3, [](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) return run_worker(t);
    Runtime rt(t);
    Client c = rt.client();
    Slice s = c.allocate(2);
    Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1});
    ProgramBuilder b("chain");
    Value v = b.param_like(x);
    for (int i = 0; i < 5; ++i) v = b.call("allreduce_add", s, {v}, {1})[0];
    b.output(v);
    EXPECT_EQ(c.run(b.build(), {x})[0].get<float>(), std::vector<float>{63});  // x <- 2x + 1, 5 times
    rt.shutdown();
  });
}

// A run holds an intermediate from its first write to its last reader: a chain of 8 nodes on one
// device has at most 2 of its 7 intermediates alive at once (the running node's input and
// output), not all 7 (which allocating every slot when the run arrives would hold).
TEST(InProcRuntime, IntermediatesLiveFromFirstWriteToLastReader) {
  testing::register_test_kernels();
  collectives::run_inproc(2, [](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) return run_worker(t);
    Runtime rt(t);
    Client c = rt.client();
    Slice s = c.allocate(1);
    const int64_t rows = 256, cols = 256, bytes = rows * cols * 4;
    Array x = c.put(s, dataflow::Sharding::kSplit, {rows, cols}, std::vector<float>(rows * cols, 1.0f));
    ProgramBuilder b("chain8");
    Value v = b.param_like(x);
    for (int i = 0; i < 8; ++i) v = b.call("scale", s, {v}, {2, rows, cols, 0})[0];
    b.output(v);
    EXPECT_EQ(c.run(b.build(), {x})[0].get<float>(), std::vector<float>(rows * cols, 256.0f));
    const auto st = c.stats();
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].peak_intermediate_bytes, static_cast<uint64_t>(2 * bytes));
    EXPECT_GE(st[0].high_water_bytes, static_cast<uint64_t>(3 * bytes));  // x, an input, an output at least
    rt.shutdown();
  });
}

// RunOptions::in_order: a worker runs its kernels in program order even when a later node is
// ready first. Device 0's first node waits for device 1's (which sleeps 50 ms); its second node
// is ready at once. In order, the first still runs first (the stamps count kernel starts).
TEST(InProcRuntime, InOrderRunsKernelsInProgramOrder) {
  testing::register_test_kernels();
  static std::atomic<int> stamps{0};
  stamps = 0;
  if (!dataflow::KernelRegistry::global().find("stamp_test"))
    dataflow::KernelRegistry::global().add("stamp_test", {{dataflow::ArgSpec{dataflow::TensorSpec{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated}},
                                                {dataflow::ArgSpec{dataflow::TensorSpec{collectives::DataType::kFloat32, {1}}, dataflow::Sharding::kReplicated}}},
                                 [](dataflow::KernelContext& ctx) { ctx.out<float>(0)[0] = static_cast<float>(stamps++); });
  collectives::run_inproc(3, [](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) return run_worker(t);
    Runtime rt(t);
    Client c = rt.client();
    Slice d0 = c.allocate(1), d1 = c.allocate(1);
    ASSERT_NE(d0.devices(), d1.devices());
    Array x0 = c.put(d0, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0});
    Array x1 = c.put(d1, dataflow::Sharding::kReplicated, {1}, std::vector<float>{0});
    ProgramBuilder b("in-order");
    Value late = b.call("sleep_ms", d1, {b.param_like(x1)}, {50})[0];
    Value first = b.call("stamp_test", d0, {late}, {})[0];           // waits for device 1
    Value second = b.call("stamp_test", d0, {b.param_like(x0)}, {})[0];  // ready at once
    b.output(first);
    b.output(second);
    RunOptions o;
    o.in_order = true;
    auto out = c.run(b.build(), {x1, x0}, o);
    EXPECT_LT(out[0].get<float>()[0], out[1].get<float>()[0]) << "device 0 ran its second node first";
    rt.shutdown();
  });
}

TEST(InProcRuntime, PerfettoTraceShowsEveryClientOnEveryDevice) {
  testing::register_test_kernels();
  const std::string path = ::testing::TempDir() + "pathways_trace_test.json";
  std::remove(path.c_str());
  collectives::run_inproc(3, [&](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) return run_worker(t);
    RuntimeOptions o;
    o.trace_path = path;
    Runtime rt(t, o);
    auto body = [&](const std::string& name) {
      Client c = rt.client(name);
      Slice s = c.allocate(2);
      Array x = c.put(s, dataflow::Sharding::kReplicated, {1}, std::vector<float>{1});
      for (int i = 0; i < 4; ++i) x = c.call("allreduce_add", s, {x}, {1})[0];
      EXPECT_EQ(x.get<float>(), std::vector<float>{31});
    };
    std::thread a(body, "alpha"), b(body, "beta");
    a.join();
    b.join();
    rt.shutdown();
  });
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  nlohmann::json j = nlohmann::json::parse(f);
  std::set<std::pair<int, std::string>> seen;  // (pid, client) of kernel slices
  std::set<std::string> devices;
  int runs = 0;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") devices.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X") continue;
    if (e["cat"] == "node") {
      seen.insert({e["pid"].get<int>(), e["name"].get<std::string>()});
      EXPECT_EQ(e["args"]["kernel"], "allreduce_add");
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    } else if (e["cat"] == "run") {
      runs++;
    }
  }
  for (int pid : {1, 2})
    for (const char* client : {"alpha", "beta"}) EXPECT_TRUE(seen.count({pid, client})) << pid << " " << client;
  // Rows are labelled with their hosts ("device 0 (rank 1) on HOST").
  auto has_prefix = [&](const std::string& p) {
    return std::any_of(devices.begin(), devices.end(), [&](const std::string& d) { return d.rfind(p, 0) == 0; });
  };
  EXPECT_TRUE(has_prefix("device 0 (rank 1) on ") && has_prefix("device 1 (rank 2) on ") &&
              has_prefix("controller (rank 0) on "));
  EXPECT_EQ(runs, 8);  // the controller's row: every run of both clients
  std::remove(path.c_str());
}

TEST(InProcRuntime, PerfettoTraceJoinsEachTransferFromSenderToReceiver) {
  // A value made on one device and scaled on the other: one worker-to-worker transfer per run.
  // The trace must show it on both devices' transfer rows and join them by a flow arrow that
  // starts on the sender and ends on the receiver, no earlier than it started.
  testing::register_test_kernels();
  const std::string path = ::testing::TempDir() + "pathways_flow_trace_test.json";
  std::remove(path.c_str());
  int sender = 0, receiver = 0;
  collectives::run_inproc(3, [&](int rank, std::shared_ptr<collectives::Transport> t) {
    if (rank != 0) return run_worker(t);
    RuntimeOptions o;
    o.trace_path = path;
    Runtime rt(t, o);
    Client c = rt.client("flows");
    Slice a = c.allocate(1), b = c.allocate(1);
    ASSERT_NE(a.devices(), b.devices());
    sender = a.devices()[0] + 1;
    receiver = b.devices()[0] + 1;
    ProgramBuilder pb("move_and_scale");
    Value v = pb.param(a, {{collectives::DataType::kFloat32, {1, 1}}, dataflow::Sharding::kReplicated});
    v = pb.call("scale", a, {v}, {2, 1, 1, 1})[0];
    v = pb.call("scale", b, {v}, {3, 1, 1, 1})[0];
    pb.output(v);
    Program p = pb.build();
    for (int i = 0; i < 3; ++i) {
      Array in = c.put(a, dataflow::Sharding::kReplicated, {1, 1}, std::vector<float>{1});
      EXPECT_EQ(c.run(p, {in})[0].get<float>(), std::vector<float>{6});
    }
    rt.shutdown();
  });
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  nlohmann::json j = nlohmann::json::parse(f);
  int sends = 0, recvs = 0;
  std::map<int64_t, nlohmann::json> starts, finishes;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "transfer") {
      const std::string n = e["name"];
      if (n.rfind("send", 0) == 0) {
        sends++;
        EXPECT_EQ(e["pid"].get<int>(), sender) << n;
      } else {
        recvs++;
        EXPECT_EQ(e["pid"].get<int>(), receiver) << n;
      }
    }
    if (e["ph"] == "s") starts[e["id"].get<int64_t>()] = e;
    if (e["ph"] == "f") finishes[e["id"].get<int64_t>()] = e;
  }
  EXPECT_EQ(sends, 3);
  EXPECT_EQ(recvs, 3);
  ASSERT_EQ(starts.size(), 3u);
  ASSERT_EQ(finishes.size(), 3u);
  for (auto& [id, s] : starts) {
    ASSERT_TRUE(finishes.count(id)) << id;
    const nlohmann::json& fin = finishes[id];
    EXPECT_EQ(s["pid"].get<int>(), sender);
    EXPECT_EQ(fin["pid"].get<int>(), receiver);
    EXPECT_GE(fin["ts"].get<double>(), s["ts"].get<double>());
  }
  std::remove(path.c_str());
}

TEST(Scheduler, ProportionalShareReleasesByWeightAndBoundsTheWindow) {
  ProportionalShareScheduler s(4);
  for (int r = 0; r < 60; ++r)
    for (uint64_t c = 1; c <= 3; ++c) s.submit({c * 1000 + r, c, 1, static_cast<double>(1 << (c - 1)), 1});
  std::map<uint64_t, int> got;
  std::vector<uint64_t> inflight;
  for (int i = 0; i < 70; ++i) {
    auto id = s.next();
    if (!id) {  // window full: finish the oldest
      ASSERT_EQ(inflight.size(), 4u);
      s.finished(inflight.front());
      inflight.erase(inflight.begin());
      id = s.next();
    }
    ASSERT_TRUE(id);
    got[*id / 1000]++;
    inflight.push_back(*id);
  }
  EXPECT_NEAR(got[1], 10, 1);  // weights 1:2:4 over 70 releases
  EXPECT_NEAR(got[2], 20, 1);
  EXPECT_NEAR(got[3], 40, 1);
  EXPECT_THROW(scheduler_by_name("lottery"), pwm::Error);
  EXPECT_STREQ(scheduler_by_name("share:8")(0)->name(), "share");
}

}  // namespace
}  // namespace pwm::pathways
