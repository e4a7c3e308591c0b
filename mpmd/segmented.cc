#include "mpmd/segmented.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <utility>

#include "common/check.h"
#include "dataflow/builder.h"
#include "programs/trace_impl.h"

namespace pwm::programs {
// The op-by-op step: trace_step over Runtime::call, each node run at once (mpmd/trainer.cc).
template std::vector<dataflow::Array> trace_step(const Shapes&, const KernelNames&, int, const State<dataflow::Array>&,
                                                 const CallFn<dataflow::Array>&, const RouteFn<dataflow::Array>&, int64_t*,
                                                 const ExpertIsland<dataflow::Array>*);
}  // namespace pwm::programs

namespace pwm::mpmd {

using dataflow::ArgSpec;
using dataflow::Value;
using dataflow::ValueId;
using programs::CallFn;
using programs::ExpertIsland;
using programs::KernelNames;
using programs::RouteFn;
using programs::Shapes;
using programs::State;

namespace {

// A value while the segments are traced: made by segment `seg`'s builder (on `slice`, -1 for the
// step's slice), or the step's input `input` (seg < 0).
struct SegValue {
  int seg = -1;
  size_t input = 0;
  Value v;
  int slice = -1;  // (-1: the step's slice)
};

class Segmenter {
 public:
  Segmenter(dataflow::Runtime& rt, int slice, const std::vector<Array>& inputs) : rt_(rt), slice_(slice), inputs_(inputs) {
    open();
  }
  std::vector<SegValue> call(const std::string& k, const std::vector<SegValue>& in, std::vector<int64_t> at,
                             int on = -1) {
    std::vector<Value> vals;
    for (const SegValue& x : in) vals.push_back(here(x));
    std::vector<SegValue> out;
    const int s = on < 0 ? slice_ : on;
    for (const Value& v : builders_.back()->call(k, s, rt_.slice_size(s), vals, std::move(at))) out.push_back({cur(), 0, v, on});
    return out;
  }
  // The counts end the segment (its output the controller fetches); the next segment starts
  // with the matrix the controller puts back as its parameter, on `on` (-1: the step's slice).
  // Counts of the segment before the current one, which has no node yet, add a matrix to the
  // same cut (--expert-island: one per experts' device).
  SegValue cut(const SegValue& counts, int on, const ArgSpec& spec) {
    if (counts.seg == cur()) {
      out_.counts_output.emplace_back();
      open();
    } else {
      PWM_CHECK(counts.seg == cur() - 1 && nodes_ == 0, "the routing counts come from the segment being traced");
    }
    out_.counts_output[static_cast<size_t>(counts.seg)].push_back(output_of(counts));
    out_.inputs.back().push_back({SegmentedStep::kPut, out_.counts_output[static_cast<size_t>(counts.seg)].size() - 1});
    const int s = on < 0 ? slice_ : on;
    return {cur(), 0, builders_.back()->param(s, rt_.slice_size(s), spec), on};
  }
  SegmentedStep finish(const std::vector<SegValue>& outputs) {
    for (const SegValue& o : outputs) out_.outputs.push_back({o.seg, o.seg < 0 ? o.input : output_of(o)});
    for (auto& b : builders_) out_.programs.push_back(rt_.load(b->build()));
    return std::move(out_);
  }

 private:
  int cur() const { return static_cast<int>(builders_.size()) - 1; }
  void open() {
    builders_.push_back(std::make_unique<dataflow::Builder>(fmt::format("chained-step-{}", builders_.size())));
    out_.inputs.emplace_back();
    params_.emplace_back();
    nodes_ = 0;
  }
  // x as a value of the current segment: itself, or a parameter bound to where it comes from.
  Value here(const SegValue& x) {
    ++nodes_;  // (here() runs for a node's inputs: the segment is no longer empty)
    if (x.seg == cur()) return x.v;
    const std::tuple<int, size_t, ValueId> key{x.seg, x.seg < 0 ? x.input : 0, x.seg < 0 ? ValueId{} : x.v.id()};
    auto it = params_.back().find(key);
    if (it != params_.back().end()) return it->second;
    const Array& in = inputs_[x.input];
    const int s = x.seg < 0 ? in.slice() : x.slice < 0 ? slice_ : x.slice;
    Value p = builders_.back()->param(s, rt_.slice_size(s), x.seg < 0 ? in.spec() : x.v.spec());
    out_.inputs.back().push_back({x.seg, x.seg < 0 ? x.input : output_of(x)});
    params_.back().emplace(key, p);
    return p;
  }
  // x's position among its segment's outputs (made an output on first use).
  size_t output_of(const SegValue& x) {
    auto& outs = outputs_[x.seg];
    auto it = outs.find(x.v.id());
    if (it != outs.end()) return it->second;
    builders_[static_cast<size_t>(x.seg)]->output(x.v);
    const size_t i = outs.size();
    outs.emplace(x.v.id(), i);
    return i;
  }

  dataflow::Runtime& rt_;
  int slice_;
  const std::vector<Array>& inputs_;
  std::vector<std::unique_ptr<dataflow::Builder>> builders_;
  std::vector<std::map<std::tuple<int, size_t, ValueId>, Value>> params_;  // per segment
  std::map<int, std::map<ValueId, size_t>> outputs_;                       // per segment: value -> output index
  SegmentedStep out_;
  int nodes_ = 0;  // node inputs traced into the current segment
};

}  // namespace

SegmentedStep segmented_step(dataflow::Runtime& rt, const Shapes& sh, const KernelNames& names, int slice,
                             const State<Array>& st, const std::vector<int>& expert_slices,
                             const std::vector<State<Array>>& expert_states) {
  std::vector<Array> inputs = st.list();
  for (const auto& e : expert_states)
    for (const Array& a : e.list()) inputs.push_back(a);
  Segmenter seg(rt, slice, inputs);
  std::vector<SegValue> sv;
  for (size_t i = 0; i < inputs.size(); ++i) sv.push_back({-1, i, {}});
  const CallFn<SegValue> call = [&](const std::string& k, std::vector<SegValue> in, std::vector<int64_t> at) {
    return seg.call(k, in, std::move(at));
  };
  ExpertIsland<SegValue> island;
  for (size_t j = 0; j < expert_states.size(); ++j)
    island.states.push_back(State<SegValue>::from(std::span(sv).subspan(State<SegValue>::kCount * (j + 1))));
  island.call = [&](int j, const std::string& k, std::vector<SegValue> in, std::vector<int64_t> at) {
    return seg.call(k, in, std::move(at), expert_slices[static_cast<size_t>(j)]);
  };
  island.route = [&](const SegValue& counts, int j) {
    return seg.cut(counts, expert_slices[static_cast<size_t>(j)], sh.island_blocks_counts());
  };
  RouteFn<SegValue> route = [&](const SegValue& counts) { return seg.cut(counts, -1, sh.route_counts()); };
  if (!expert_states.empty()) route = {};
  return seg.finish(programs::trace_step<SegValue>(sh, names, sh.cfg().mesh.tp, State<SegValue>::from(sv), call, route, nullptr,
                                         expert_states.empty() ? nullptr : &island));
}

namespace {
// Where each array is read last: (segment, parameter) of its last reader; a step output is read
// after every segment (kStepOutput), so it is never moved out.
using Key = std::pair<int, size_t>;
constexpr size_t kStepOutput = static_cast<size_t>(-1);
std::map<Key, Key> last_readers(const SegmentedStep& st) {
  std::map<Key, Key> last;
  for (size_t k = 0; k < st.inputs.size(); ++k)
    for (size_t j = 0; j < st.inputs[k].size(); ++j) {
      const SegmentedStep::Source& s = st.inputs[k][j];
      if (s.seg != SegmentedStep::kPut) last[{s.seg, s.index}] = {static_cast<int>(k), j};
    }
  for (const SegmentedStep::Source& s : st.outputs) last[{s.seg, s.index}] = {-1, kStepOutput};
  return last;
}
}  // namespace

std::vector<Array> SegmentedStep::run(dataflow::Runtime& rt, std::vector<Array> in_state, const PutFn& put_fn) const {
  std::vector<std::vector<Array>> outs(programs.size());
  std::vector<Array> puts;
  const auto source = [&](const Source& s) -> Array& {
    return s.seg == kPut ? puts.at(s.index) : s.seg < 0 ? in_state.at(s.index) : outs.at(static_cast<size_t>(s.seg)).at(s.index);
  };
  const std::map<Key, Key> last = last_readers(*this);
  for (size_t k = 0; k < programs.size(); ++k) {
    std::vector<Array> in;
    for (size_t j = 0; j < inputs[k].size(); ++j) {
      const Source& s = inputs[k][j];
      const bool moved = s.seg != kPut && last.at({s.seg, s.index}) == Key{static_cast<int>(k), j};
      in.push_back(moved ? std::exchange(source(s), Array{}) : source(s));
    }
    outs[k] = rt.execute(*programs[k], std::move(in), "step");
    if (k + 1 == programs.size()) break;
    puts.clear();  // the round trips of the cut after segment k
    for (size_t i = 0; i < counts_output[k].size(); ++i) puts.push_back(put_fn(outs[k].at(counts_output[k][i]), i));
  }
  std::vector<Array> result;
  for (const Source& s : outputs) result.push_back(source(s));
  return result;
}

}  // namespace pwm::mpmd
