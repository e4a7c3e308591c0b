// The message codecs that do not fit on a line (messages.h).
#include "pathways/messages.h"

#include <fmt/ranges.h>

namespace pwm::pathways {

void write_spec(Writer& w, const dataflow::TensorSpec& s) {
  w.put<uint8_t>(static_cast<uint8_t>(s.dtype));
  w.vec(s.shape);
}

// An instruction field by field: its padding bytes are indeterminate, and a message's bytes must
// be a function of its fields (a decoded message encodes to the same bytes: tests/fuzz/fuzz_wire.cc).
constexpr size_t kInstrWireBytes = 1 + 4 + 4 + 4 + 8 + 8 + 8 + 4 + 4 + 4;
// (A new field of Instr must be added to write_instr and read_instr: this fails until then.)
static_assert(sizeof(dataflow::Instr) == 56, "dataflow::Instr changed: add the field to write_instr and read_instr, then update this");

void write_instr(Writer& w, const dataflow::Instr& i) {
  w.put<uint8_t>(static_cast<uint8_t>(i.op));
  w.put(i.stage);
  w.put(i.slot);
  w.put(i.slot2);
  w.put(i.offset);
  w.put(i.offset2);
  w.put(i.bytes);
  w.put(i.peer);
  w.put(i.xfer);
  w.put(i.exec);
}

dataflow::Instr read_instr(Reader& r) {
  dataflow::Instr i;
  const uint8_t op = r.get<uint8_t>();
  if (op > static_cast<uint8_t>(dataflow::Op::kExec)) PWM_THROW("pathways wire: bad instruction op {}", op);
  i.op = static_cast<dataflow::Op>(op);
  i.stage = r.get<uint32_t>();
  i.slot = r.get<int32_t>();
  i.slot2 = r.get<int32_t>();
  i.offset = r.get<uint64_t>();
  i.offset2 = r.get<uint64_t>();
  i.bytes = r.get<uint64_t>();
  i.peer = r.get<int32_t>();
  i.xfer = r.get<uint32_t>();
  i.exec = r.get<int32_t>();
  return i;
}

dataflow::TensorSpec read_spec(Reader& r) {
  dataflow::TensorSpec s;
  const uint8_t t = r.get<uint8_t>();
  if (t > static_cast<uint8_t>(collectives::DataType::kInt64)) PWM_THROW("pathways wire: bad data type {} in a tensor spec", t);
  s.dtype = static_cast<collectives::DataType>(t);
  s.shape = r.vec<int64_t>();
  // Its size in bytes must be representable: TensorSpec::bytes() multiplies the dimensions.
  int64_t bytes = static_cast<int64_t>(collectives::dtype_size(s.dtype));
  for (int64_t d : s.shape) {
    if (d < 0) PWM_THROW("pathways wire: negative dimension {} in a tensor spec", d);
    if (__builtin_mul_overflow(bytes, d, &bytes))
      PWM_THROW("pathways wire: a tensor spec of shape [{}] overflows 64 bits", fmt::join(s.shape, ","));
  }
  return s;
}

void PutShard::write(Writer& w) const {
  w.put(object);
  w.put(owner);
  write_spec(w, spec);
  w.bytes(bytes.data(), bytes.size());
}

PutShard PutShard::read(Reader& r) {
  PutShard m;
  m.object = r.get<uint64_t>();
  m.owner = r.get<uint64_t>();
  m.spec = read_spec(r);
  const size_t n = m.spec.bytes();
  m.bytes = {r.bytes(n), n};
  return m;
}

void FetchReply::write(Writer& w) const {
  w.put(request);
  w.str(error);
  w.bytes(bytes.data(), bytes.size());
}

FetchReply FetchReply::read(Reader& r) {
  FetchReply m;
  m.request = r.get<uint64_t>();
  m.error = r.str();
  const size_t n = r.remaining();  // the rest of the message
  m.bytes = {r.bytes(n), n};
  return m;
}

void LoadProgram::write(Writer& w) const {
  w.put(id);
  w.str(name);
  w.put<uint32_t>(static_cast<uint32_t>(slots.size()));
  for (auto& s : slots) write_spec(w, s);
  w.vec(slot_writers);
  w.vec(params);
  w.vec(outputs);
  w.put<uint32_t>(static_cast<uint32_t>(instrs.size()));
  for (auto& i : instrs) write_instr(w, i);
  w.put<uint32_t>(static_cast<uint32_t>(execs.size()));
  for (auto& e : execs) {
    w.put(e.node);
    w.str(e.kernel);
    w.vec(e.attrs);
    w.put(e.shard);
    w.put(e.num_shards);
    w.put(e.context);
    w.vec(e.group);
    w.put<uint8_t>(e.collectives);
    w.vec(e.ins);
    w.vec(e.outs);
  }
  w.put(num_stages);
}

LoadProgram LoadProgram::read(Reader& r) {
  LoadProgram p;
  p.id = r.get<uint64_t>();
  p.name = r.str();
  p.slots.resize(r.count(5));
  for (auto& s : p.slots) s = read_spec(r);
  p.slot_writers = r.vec<uint32_t>();
  p.params = r.vec<dataflow::SlotBinding>();
  p.outputs = r.vec<dataflow::SlotBinding>();
  p.instrs.resize(r.count(kInstrWireBytes));
  for (auto& i : p.instrs) i = read_instr(r);
  p.execs.resize(r.count(37));  // an exec takes >= 37 bytes on the wire
  for (auto& e : p.execs) {
    e.node = r.get<uint32_t>();
    e.kernel = r.str();
    e.attrs = r.vec<int64_t>();
    e.shard = r.get<int32_t>();
    e.num_shards = r.get<int32_t>();
    e.context = r.get<uint32_t>();
    e.group = r.vec<int32_t>();
    e.collectives = r.get<uint8_t>() != 0;
    e.ins = r.vec<int32_t>();
    e.outs = r.vec<int32_t>();
  }
  p.num_stages = r.get<uint32_t>();
  return p;
}

}  // namespace pwm::pathways
