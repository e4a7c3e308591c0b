// The wire codecs (messages.h): every message survives encode then decode field for field, and
// every truncation of its encoding, or a garbled length, type or spec, is a pwm::Error (never a
// crash or an out-of-bounds read: the tests run under the sanitizers in CI builds).
#include <gtest/gtest.h>

#include <cstring>

#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/messages.h"
#include "pathways/object_id.h"

namespace pwm::pathways {
namespace {

// Encodes `m`, decodes it back, and checks that each strict prefix of the encoding (and the
// encoding with a byte appended) fails cleanly.
template <typename M>
M round_trip(const M& m) {
  const std::vector<uint8_t> bytes = encode(m);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(decode<M>(bytes.data(), n), pwm::Error) << msg_type_name(M::kType) << " cut at " << n;
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(decode<M>(longer), pwm::Error) << msg_type_name(M::kType) << " with a trailing byte";
  return decode<M>(bytes);
}

// A message of listed fields comes back field for field.
template <typename M>
void expect_round_trip(const M& m) {
  const M back = round_trip(m);
  EXPECT_TRUE(M::fields(back) == M::fields(m)) << msg_type_name(M::kType);
}

dataflow::TensorSpec spec_f32(std::vector<int64_t> shape) { return dataflow::TensorSpec{collectives::DataType::kFloat32, std::move(shape)}; }

TEST(Messages, ControllerToWorkerRoundTrip) {
  expect_round_trip(EvictProgram{42});
  expect_round_trip(RunHeader{7, 9, 3, 0xfffff, kRunSequential | kRunAwaited, {1, 2, output_object_id(5, 1)}});
  expect_round_trip(RunHeader{});
  expect_round_trip(ReleaseStage{11, 4});
  expect_round_trip(Fetch{5, 6});
  expect_round_trip(Free{{1, 2, 3}});
  expect_round_trip(Free{});
  expect_round_trip(FreeOwner{8});
  expect_round_trip(MoveOut{1, 2, -3});
  expect_round_trip(MoveIn{1, 2, dataflow::TensorSpec{collectives::DataType::kInt64, {3, 4}}, 5, 6});
  expect_round_trip(StatsRequest{77});
  expect_round_trip(CountContext{896});
  expect_round_trip(DrainContext{6, {{6, 2, 3}, {10, 1, 1ull << 40}}});
  expect_round_trip(DrainContext{6, {{6, 2, 0}}, true});
  expect_round_trip(DrainContext{});

  const std::vector<float> v{1.5f, -2.f, 3.25f};
  PutShard p{9, 4, spec_f32({3}), {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)}};
  round_trip(p);
  // The decoded bytes view points into the body: keep the body alive while reading them.
  const std::vector<uint8_t> body = encode(p);
  const PutShard back = decode<PutShard>(body);
  EXPECT_EQ(back.object, 9u);
  EXPECT_EQ(back.owner, 4u);
  EXPECT_EQ(back.spec, spec_f32({3}));
  ASSERT_EQ(back.bytes.size(), v.size() * sizeof(float));
  std::vector<float> got(v.size());
  std::memcpy(got.data(), back.bytes.data(), back.bytes.size());
  EXPECT_EQ(got, v);
}

TEST(Messages, WorkerToControllerRoundTrip) {
  expect_round_trip(Hello{"node-1", 65536});
  expect_round_trip(Hello{});
  expect_round_trip(ContextCount{6, {{6, 2, 4, 1}, {7, 1, 0, 1ull << 40}}});
  expect_round_trip(ContextDrained{6});
  expect_round_trip(RunDone{3, "kernel 'boom' failed", 0.25});
  expect_round_trip(RunDone{3, "", 0});
  expect_round_trip(StageDone{3, 2});
  expect_round_trip(NodeEvent{3, 1, true});
  expect_round_trip(NodeEvent{3, 1, false});
  expect_round_trip(TraceRecords{{TraceRecord{1, 2, 3, 4, 5, 0.5, 0.75}, TraceRecord{6, 7, 8, 9, 10, 1.0, 2.0}}});
  WorkerStats s;
  s.rank = 2;
  s.objects = 3;
  s.bytes = 1 << 20;
  s.peak_bytes = 7;
  expect_round_trip(StatsReply{12, s});

  const std::vector<uint8_t> shard{1, 2, 3, 4, 5};
  // A fetch reply's shard is the rest of the message: a cut one decodes to fewer bytes, so only
  // the cuts inside the request id and the error must fail.
  const auto enc = encode(FetchReply{4, "", shard});
  const FetchReply back = decode<FetchReply>(enc);
  EXPECT_EQ(back.request, 4u);
  EXPECT_EQ(back.error, "");
  EXPECT_EQ(std::vector<uint8_t>(back.bytes.begin(), back.bytes.end()), shard);
  for (size_t n = 0; n < 12; ++n) EXPECT_THROW(decode<FetchReply>(enc.data(), n), pwm::Error) << n;
  const FetchReply err = decode<FetchReply>(encode(FetchReply{5, "object 3 does not exist", {}}));
  EXPECT_EQ(err.error, "object 3 does not exist");
  EXPECT_TRUE(err.bytes.empty());
}

TEST(Messages, WorkerProgramRoundTrip) {
  LoadProgram p;
  p.id = 3;
  p.name = "prog";
  p.slots = {spec_f32({2}), dataflow::TensorSpec{collectives::DataType::kInt32, {}}};
  p.slot_writers = {0, 1};
  p.params = {{0, 0}};
  p.outputs = {{0, 1}};
  p.instrs = {dataflow::Instr{dataflow::Op::kExec, 0, -1, -1, 0, 0, 0, -1, 0, 0}};
  dataflow::ExecInfo e;
  e.kernel = "iota";
  e.attrs = {1, 2};
  e.group = {1, 2};
  e.ins = {0};
  e.outs = {1};
  p.execs = {e};
  p.num_stages = 1;
  const LoadProgram back = round_trip(p);
  EXPECT_EQ(back.id, 3u);
  EXPECT_EQ(back.name, "prog");
  EXPECT_EQ(back.slots, p.slots);
  EXPECT_EQ(back.slot_writers, p.slot_writers);
  ASSERT_EQ(back.execs.size(), 1u);
  EXPECT_EQ(back.execs[0].kernel, "iota");
  EXPECT_EQ(back.execs[0].attrs, e.attrs);
  EXPECT_EQ(back.execs[0].outs, e.outs);
  EXPECT_EQ(back.num_stages, 1u);
}

// Garbled fields that a prefix cannot produce: a huge vector length (must not allocate it), a
// bad data type, a negative dimension.
TEST(Messages, GarbledBodiesAreErrors) {
  auto free_bytes = encode(Free{{1, 2}});
  const uint32_t huge = 0xfffffff0u;
  std::memcpy(free_bytes.data(), &huge, sizeof(huge));
  EXPECT_THROW(decode<Free>(free_bytes), pwm::Error);

  auto move = encode(MoveIn{1, 2, spec_f32({4}), 5, 6});
  std::vector<uint8_t> bad_type = move;
  bad_type[16] = 200;  // after object and owner: the data type
  EXPECT_THROW(decode<MoveIn>(bad_type), pwm::Error);
  std::vector<uint8_t> bad_dim = move;
  const int64_t neg = -4;
  std::memcpy(bad_dim.data() + 16 + 1 + 4, &neg, sizeof(neg));
  EXPECT_THROW(decode<MoveIn>(bad_dim), pwm::Error);

  auto hello = encode(Hello{"h", 0});
  std::memcpy(hello.data(), &huge, sizeof(huge));  // the host name's length
  EXPECT_THROW(decode<Hello>(hello), pwm::Error);

  LoadProgram p;
  p.name = "p";
  auto prog = encode(p);
  std::memcpy(prog.data() + 8 + 4 + 1, &huge, sizeof(huge));  // the slot count
  EXPECT_THROW(decode<LoadProgram>(prog), pwm::Error);
}

TEST(ObjectIds, OutputsOfARunRoundTrip) {
  for (uint64_t run : {uint64_t{0}, uint64_t{1}, uint64_t{123456789}, kMaxRunId - 1})
    for (uint32_t k : {0u, 1u, 65535u}) {
      const uint64_t id = output_object_id(run, k);
      EXPECT_EQ(run_of_object(id), run);
      EXPECT_EQ(output_index_of(id), k);
    }
  EXPECT_EQ(output_object_id(1, 2), (uint64_t{1} << 16) + 2);  // the layout workers and clients share
}

}  // namespace
}  // namespace pwm::pathways
