// Fuzz target: the controller <-> worker message decoder (pathways/messages.h, lowering.h's
// LoadProgram). Input: one byte choosing the message type, then the message body, as a worker
// or the controller receives it from Channel. A body that decodes must survive a round trip:
// encode(decode(x)) decodes again and encodes to the same bytes (the codec is one list of
// fields both ways). Decoded specs are sized as the worker sizes them (TensorSpec::bytes).
#include <cstring>

#include "common/check.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/messages.h"
#include "tests/fuzz/fuzz.h"

using namespace pwm::pathways;
namespace dataflow = pwm::dataflow;
namespace collectives = pwm::collectives;

namespace {

void size_specs(const dataflow::TensorSpec& s) { (void)s.bytes(), (void)s.str(); }
void size_specs(const PutShard& m) { size_specs(m.spec); }
void size_specs(const MoveIn& m) { size_specs(m.spec); }
void size_specs(const LoadProgram& m) {
  for (auto& s : m.slots) size_specs(s);
}
void size_specs(const auto&) {}

template <typename M>
void check(const uint8_t* p, size_t n) {
  M m;
  try {
    m = decode<M>(p, n);
  } catch (const pwm::Error&) {
    return;  // rejected with one clear error: what the protocol promises
  }
  size_specs(m);
  const std::vector<uint8_t> once = encode(m);
  const M again = decode<M>(once);
  if (encode(again) != once) pwm_fuzz_fail(std::string(msg_type_name(M::kType)) + ": round trip changed the bytes");
}

// Every message type with a payload, in MsgType order (index = the input's first byte).
using Checker = void (*)(const uint8_t*, size_t);
constexpr Checker kCheckers[] = {
    check<LoadProgram>, check<EvictProgram>, check<RunHeader>, check<ReleaseStage>,
    check<PutShard>,      check<Fetch>,        check<Free>,      check<FreeOwner>,
    check<MoveOut>,       check<MoveIn>,       check<StatsRequest>, check<Hello>,
    check<RunDone>,       check<StageDone>,    check<NodeEvent>, check<FetchReply>,
    check<StatsReply>,    check<TraceRecords>,   check<CountContext>, check<DrainContext>,
    check<ContextCount>,  check<ContextDrained>,
};
constexpr size_t kNumTypes = sizeof(kCheckers) / sizeof(kCheckers[0]);

template <typename M>
std::pair<std::string, std::string> seed(const char* name, size_t index, const M& m) {
  const std::vector<uint8_t> body = encode(m);
  std::string s(1, static_cast<char>(index));
  s.append(reinterpret_cast<const char*>(body.data()), body.size());
  return {name, s};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kCheckers[data[0] % kNumTypes](data + 1, size - 1);
  return 0;
}

std::vector<std::pair<std::string, std::string>> pwm_fuzz_seeds() {
  LoadProgram wp;
  wp.id = 7;
  wp.name = "train_step";
  wp.slots = {dataflow::TensorSpec{collectives::DataType::kFloat32, {4, 8}}, dataflow::TensorSpec{collectives::DataType::kInt64, {3}}};
  wp.slot_writers = {0, 1};
  wp.params = {dataflow::SlotBinding{0, 0}};
  wp.outputs = {dataflow::SlotBinding{0, 1}};
  wp.instrs = {dataflow::Instr{}};
  dataflow::ExecInfo e;
  e.kernel = "matmul";
  e.attrs = {1, 2};
  e.group = {1, 2};
  e.ins = {0};
  e.outs = {1};
  wp.execs = {e};
  wp.num_stages = 1;
  static const uint8_t shard[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  PutShard put{3, 4, dataflow::TensorSpec{collectives::DataType::kFloat32, {2, 2}}, {shard, 16}};
  RunHeader run{9, 7, 4, 100, kRunTrace, {11, 12}};
  FetchReply reply{5, "", {shard, 8}};
  TraceRecords tr{{TraceRecord{9, 7, 4, 1, 0, 0.5, 0.75, 2, 3, 64, kTraceSend}}};
  return {seed("program", 0, wp), seed("put", 4, put),   seed("run", 2, run),
          seed("moveout", 8, MoveOut{1, 2, 3}), seed("movein", 9, MoveIn{1, 2, dataflow::TensorSpec{collectives::DataType::kFloat32, {5}}, 3, 4}),
          seed("hello", 11, Hello{"host-a", 1 << 20}), seed("rundone", 12, RunDone{9, "boom", 0.25}),
          seed("fetchreply", 15, reply), seed("trace", 17, tr),
          seed("countcontext", 18, CountContext{6}), seed("draincontext", 19, DrainContext{6, {{6, 2, 3}, {8, 1, 1}}, false}),
          seed("contextcount", 20, ContextCount{6, {{6, 2, 4, 1}, {7, 1, 0, 2}}}), seed("contextdrained", 21, ContextDrained{6})};
}
