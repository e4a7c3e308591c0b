#include "dataflow/lowering.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>


namespace pwm::dataflow {

namespace {

// A value placed on devices: one slot per shard.
struct Placed {
  std::vector<int> ranks;
  std::vector<int32_t> slots;
  ArgSpec spec;
};

class Lowerer {
 public:
  Lowerer(const ProgramDef& def, uint64_t id, const SliceLookup& lookup)
      : def_(def), lookup_(lookup) {
    out_.id = id;
    out_.name = def.name;
  }

  LoweredProgram run() {
    if (!def_.error.empty()) PWM_THROW("{}", def_.error);
    const uint32_t stages = static_cast<uint32_t>(def_.nodes.size());
    out_.stage_ranks.resize(stages);
    for (size_t p = 0; p < def_.params.size(); ++p) {
      const ParamDef& pd = def_.params[p];
      SliceMapping m = slice(pd.slice);
      Placed v{m.ranks, {}, pd.spec};
      for (int r : m.ranks) {
        int32_t s = new_slot(r, pd.spec.shard, 0);
        v.slots.push_back(s);
        wp(r).params.push_back({static_cast<uint32_t>(p), s});
      }
      values_[{-1, static_cast<int>(p)}] = v;
    }
    for (size_t n = 0; n < def_.nodes.size(); ++n) lower_node(static_cast<uint32_t>(n));
    for (size_t o = 0; o < def_.outputs.size(); ++o) {
      const ValueId id = def_.outputs[o];
      const Placed& v = value(id);
      for (size_t k = 0; k < v.ranks.size(); ++k)
        wp(v.ranks[k]).outputs.push_back({static_cast<uint32_t>(o), v.slots[k]});
      out_.outputs.push_back({def_.value_slice(id), v.spec, v.ranks});
    }
    if (out_.transfers > kMaxTransfersPerProgram)
      PWM_THROW("program '{}' needs {} transfers; at most {} fit the tag space", def_.name, out_.transfers,
                kMaxTransfersPerProgram);
    for (auto& [r, w] : out_.workers) {
      w.id = out_.id;
      w.name = def_.name;
      w.num_stages = stages;
    }
    return std::move(out_);
  }

 private:
  SliceMapping slice(int id) {
    auto it = slices_.find(id);
    if (it != slices_.end()) return it->second;
    SliceMapping m = lookup_(id);
    out_.generations[id] = m.generation;
    out_.islands.insert(m.island);
    return slices_[id] = m;
  }

  WorkerProgram& wp(int rank) { return out_.workers[rank]; }

  int32_t new_slot(int rank, const TensorSpec& spec, uint32_t writers) {
    WorkerProgram& w = wp(rank);
    w.slots.push_back(spec);
    w.slot_writers.push_back(writers);
    return static_cast<int32_t>(w.slots.size()) - 1;
  }

  void add(int rank, const Instr& in) {
    wp(rank).instrs.push_back(in);
    out_.stage_ranks[in.stage].insert(rank);
  }

  const Placed& value(ValueId id) {
    auto it = values_.find(id);
    PWM_CHECK(it != values_.end(), "lowering: value ({}, {}) used before it is defined", id.node, id.index);
    return it->second;
  }

  // The value `id` as `want` on `ranks`: itself when it already lies so, else a reshard.
  std::vector<int32_t> place(ValueId id, const std::vector<int>& ranks, const ArgSpec& want, uint32_t stage) {
    const Placed& src = value(id);
    if (src.ranks == ranks && src.spec == want) return src.slots;
    auto key = std::make_tuple(id.node, id.index, ranks, static_cast<int>(want.sharding));
    auto it = reshards_.find(key);
    if (it != reshards_.end()) return it->second;
    std::vector<int32_t> dst_slots;
    for (int r : ranks) dst_slots.push_back(new_slot(r, want.shard, 0));
    const int M = static_cast<int>(src.ranks.size()), N = static_cast<int>(ranks.size());
    const TensorSpec logical = src.spec.logical(M);
    const int64_t rows = logical.shape.empty() ? 1 : logical.shape[0];
    const uint64_t row_bytes = rows == 0 ? 0 : logical.bytes() / static_cast<uint64_t>(rows);
    const bool src_split = src.spec.sharding == Sharding::kSplit;
    const bool dst_split = want.sharding == Sharding::kSplit;
    for (int j = 0; j < N; ++j) {
      const int64_t dlo = dst_split ? j * rows / N : 0, dhi = dst_split ? (j + 1) * rows / N : rows;
      if (src_split) {
        for (int i = 0; i < M; ++i) {
          const int64_t slo = i * rows / M, shi = (i + 1) * rows / M;
          const int64_t lo = std::max(slo, dlo), hi = std::min(shi, dhi);
          if (lo >= hi) continue;
          piece(src.ranks[i], src.slots[i], (lo - slo) * row_bytes, ranks[j], dst_slots[j], (lo - dlo) * row_bytes,
                (hi - lo) * row_bytes, stage);
        }
      } else {
        // A replica on the same device if there is one, else spread the sources.
        auto pos = std::find(src.ranks.begin(), src.ranks.end(), ranks[j]);
        const int i = pos != src.ranks.end() ? static_cast<int>(pos - src.ranks.begin()) : j % M;
        piece(src.ranks[i], src.slots[i], dlo * row_bytes, ranks[j], dst_slots[j], 0, (dhi - dlo) * row_bytes, stage);
      }
    }
    return reshards_[key] = dst_slots;
  }

  void piece(int src_rank, int32_t src_slot, uint64_t src_off, int dst_rank, int32_t dst_slot, uint64_t dst_off,
             uint64_t bytes, uint32_t stage) {
    if (bytes == 0) return;
    wp(dst_rank).slot_writers[dst_slot]++;
    if (src_rank == dst_rank) {
      Instr c;
      c.op = Op::kCopy;
      c.stage = stage;
      c.slot = src_slot;
      c.offset = src_off;
      c.slot2 = dst_slot;
      c.offset2 = dst_off;
      c.bytes = bytes;
      add(src_rank, c);
      return;
    }
    const uint32_t x = out_.transfers++;
    Instr s;
    s.op = Op::kSend;
    s.stage = stage;
    s.slot = src_slot;
    s.offset = src_off;
    s.bytes = bytes;
    s.peer = dst_rank;
    s.xfer = x;
    add(src_rank, s);
    Instr r;
    r.op = Op::kRecv;
    r.stage = stage;
    r.slot = dst_slot;
    r.offset = dst_off;
    r.bytes = bytes;
    r.peer = src_rank;
    r.xfer = x;
    add(dst_rank, r);
  }

  void lower_node(uint32_t n) {
    const NodeDef& nd = def_.nodes[n];
    SliceMapping m = slice(nd.slice);
    PWM_CHECK_EQ(static_cast<int>(m.ranks.size()), nd.num_shards);
    std::vector<std::vector<int32_t>> ins;
    for (size_t i = 0; i < nd.inputs.size(); ++i) ins.push_back(place(nd.inputs[i], m.ranks, nd.in_specs[i], n));
    std::vector<Placed> outs(nd.out_specs.size());
    for (size_t o = 0; o < nd.out_specs.size(); ++o) outs[o] = {m.ranks, {}, nd.out_specs[o]};
    for (int k = 0; k < nd.num_shards; ++k) {
      const int r = m.ranks[k];
      ExecInfo e;
      e.node = n;
      e.kernel = nd.kernel;
      e.attrs = nd.attrs;
      e.shard = k;
      e.num_shards = nd.num_shards;
      e.context = m.context;
      e.group.assign(m.ranks.begin(), m.ranks.end());
      e.collectives = nd.collectives;
      for (auto& in : ins) e.ins.push_back(in[k]);
      for (size_t o = 0; o < nd.out_specs.size(); ++o) {
        int32_t s = new_slot(r, nd.out_specs[o].shard, 1);
        e.outs.push_back(s);
        outs[o].slots.push_back(s);
      }
      WorkerProgram& w = wp(r);
      w.execs.push_back(std::move(e));
      Instr x;
      x.op = Op::kExec;
      x.stage = n;
      x.exec = static_cast<int32_t>(w.execs.size()) - 1;
      add(r, x);
    }
    for (size_t o = 0; o < outs.size(); ++o) values_[{static_cast<int>(n), static_cast<int>(o)}] = outs[o];
    out_.node_ranks.push_back(m.ranks);
  }

  const ProgramDef& def_;
  const SliceLookup& lookup_;
  LoweredProgram out_;
  std::map<int, SliceMapping> slices_;
  std::map<ValueId, Placed> values_;
  std::map<std::tuple<int, int, std::vector<int>, int>, std::vector<int32_t>> reshards_;
};

}  // namespace

std::vector<int> LoweredProgram::ranks() const {
  std::vector<int> r;
  for (auto& [k, v] : workers) r.push_back(k);
  return r;
}

std::string LoweredProgram::describe_wait(int rank, uint32_t node) const {
  auto it = workers.find(rank);
  if (it == workers.end()) return "";
  std::set<int> from;
  for (auto& in : it->second.instrs)
    if (in.stage == node && in.op == Op::kRecv) from.insert(in.peer);
  if (from.empty()) return "";
  std::vector<int> devs;
  for (int r : from) devs.push_back(r - 1);
  return fmt::format("its inputs come from device(s) {}", fmt::join(devs, ","));
}

LoweredProgram lower(const ProgramDef& def, uint64_t id, const SliceLookup& lookup) {
  return Lowerer(def, id, lookup).run();
}

uint64_t WorkerProgram::buffer_bytes() const {
  std::vector<bool> bound(slots.size(), false);
  for (auto& p : params) bound.at(p.slot) = true;
  uint64_t b = 0;
  for (size_t s = 0; s < slots.size(); ++s)
    if (!bound[s]) b += slots[s].bytes();
  return b;
}

}  // namespace pwm::dataflow
