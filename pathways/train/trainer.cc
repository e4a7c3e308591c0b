#include "pathways/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <deque>
#include <functional>

#include "common/check.h"
#include "common/stats.h"
#include "common/time.h"
#include "common/trace.h"
#include "model/full_state.h"
#include "model/params.h"
#include "model/train_report.h"
#include "pathways/train/kernels.h"

namespace pwm::pathways::train {

namespace {

using State = std::vector<Array>;  // params, m, v, step of one slice

std::string tp_sfx(int tp) { return tp > 1 ? "_tp" : ""; }
int64_t head_n(const model::TrainConfig& c) { return c.model.vocab * c.model.d_model + c.model.d_model; }

// The per-layer graph of one step on one dp x tp slice. `call` adds a node to a traced program
// (chained) or runs it as its own program (opbyop): the same graph either way, and the same
// arithmetic as the fused kernel (gradients accumulate over micro-batches in the same order).
template <typename V>
std::vector<V> step_graph(const model::TrainConfig& cfg, int tp, const std::vector<V>& st,
                          const std::function<std::vector<V>(const std::string&, std::vector<V>, std::vector<int64_t>)>& call) {
  const int L = static_cast<int>(cfg.model.n_layers);
  const V &params = st[0], &step = st[3];
  std::vector<V> gl(L), losses;
  V gE{};
  for (int64_t m = 0; m < cfg.microbatches; ++m) {
    const bool acc = m > 0;
    V tokens = call("pw_batch", {step}, {tp, m})[0];
    std::vector<V> xs{call("pw_embed_fwd", {params, tokens}, {tp})[0]}, saved;
    for (int l = 0; l < L; ++l) {
      auto o = call("pw_block_fwd" + tp_sfx(tp), {params, xs.back()}, {tp, l});
      xs.push_back(o[0]);
      saved.push_back(o[1]);
    }
    std::vector<V> hin{params, xs.back(), tokens};
    if (acc) hin.push_back(gE);
    auto h = call(acc ? "pw_head_acc" : "pw_head", hin, {tp});
    losses.push_back(h[0]);
    V dx = h[1];
    gE = h[2];
    for (int l = L - 1; l >= 0; --l) {
      std::vector<V> bin{params, saved[l], xs[l], dx};
      if (acc) bin.push_back(gl[l]);
      auto b = call("pw_block_bwd" + tp_sfx(tp) + (acc ? "_acc" : ""), bin, {tp, l});
      dx = b[0];
      gl[l] = b[1];
    }
    gE = call("pw_embed_bwd", {tokens, dx, gE}, {tp})[0];
  }
  std::vector<V> uin{st[0], st[1], st[2], st[3]};
  uin.push_back(call("pw_dp_allreduce", {gE}, {tp, head_n(cfg)})[0]);
  const model::ParamLayout layout(cfg.model, 0, tp);
  for (int l = 0; l < L; ++l)
    uin.push_back(call("pw_dp_allreduce", {gl[l]}, {tp, layout.layer(l).end - layout.layer(l).begin})[0]);
  for (auto& x : losses) uin.push_back(x);
  return call("pw_update", uin, {tp});
}

// The pipeline's step: S single-device slices, stage s holding layers [layer_begin(s), ...).
Program pipeline_program(const model::TrainConfig& cfg, const PathwaysOptions& o, const std::vector<Slice>& sl,
                         const std::vector<State>& states) {
  const int S = o.stages, L = static_cast<int>(cfg.model.n_layers);
  const int64_t M = cfg.microbatches;
  PipelineShape pipe{S};
  ProgramBuilder b(fmt::format("pipeline-{}-S{}-M{}", o.schedule, S, M));
  std::vector<std::vector<Value>> st(S);
  for (int s = 0; s < S; ++s)
    for (auto& a : states[s]) st[s].push_back(b.param_like(a));
  auto call = [&](int s, const std::string& k, std::vector<Value> in, std::vector<int64_t> attrs) {
    return b.call(k, sl[s], in, std::move(attrs));
  };
  std::vector<Value> tok0(M), tokL(M), loss(M), dhead(M);
  std::vector<std::vector<Value>> xout(S, std::vector<Value>(M)), dxout(S, std::vector<Value>(M));
  std::vector<std::vector<std::vector<Value>>> xs(S, std::vector<std::vector<Value>>(M)), saved = xs;
  std::vector<std::vector<Value>> gl(L);  // per layer: the running sum over micro-batches
  Value gEh, gL;
  auto F = [&](int s, int64_t m) {
    if (s == 0) tok0[m] = call(0, "pw_batch", {st[0][3]}, {1, m})[0];
    Value x = s == 0 ? call(0, "pw_embed_fwd", {st[0][0], tok0[m]}, {1})[0] : xout[s - 1][m];
    for (int l = pipe.layer_begin(s, L); l < pipe.layer_begin(s + 1, L); ++l) {
      xs[s][m].push_back(x);
      auto r = call(s, "pw_block_fwd", {st[s][0], x}, {1, l});
      x = r[0];
      saved[s][m].push_back(r[1]);
    }
    xout[s][m] = x;
    if (s == S - 1) {
      tokL[m] = call(s, "pw_batch", {st[s][3]}, {1, m})[0];
      std::vector<Value> hin{st[s][0], x, tokL[m]};
      if (m > 0) hin.push_back(gEh);
      auto h = call(s, m > 0 ? "pw_head_acc" : "pw_head", hin, {1});
      loss[m] = h[0];
      dhead[m] = h[1];  // the gradient entering the last stage's backward
      gEh = h[2];
    }
  };
  auto B = [&](int s, int64_t m) {
    Value dx = s == S - 1 ? dhead[m] : dxout[s + 1][m];
    const int l0 = pipe.layer_begin(s, L), l1 = pipe.layer_begin(s + 1, L);
    for (int l = l1 - 1; l >= l0; --l) {
      std::vector<Value> in{st[s][0], saved[s][m][l - l0], xs[s][m][l - l0], dx};
      if (m > 0) in.push_back(gl[l].back());
      auto r = call(s, m > 0 ? "pw_block_bwd_acc" : "pw_block_bwd", in, {1, l});
      dx = r[0];
      gl[l].push_back(r[1]);
    }
    dxout[s][m] = dx;  // what stage s-1's backward starts from
    if (s == 0) {
      Value prev = m > 0 ? gL : call(0, "pw_zeros", {}, {1, head_n(cfg)})[0];
      gL = call(0, "pw_embed_bwd", {tok0[m], dx, prev}, {1})[0];
    }
  };
  // Per-stage order, then one global order that respects the dependencies.
  struct Op { bool fwd; int64_t m; };
  std::vector<std::vector<Op>> order(S);
  for (int s = 0; s < S; ++s) {
    if (o.schedule == "gpipe") {
      for (int64_t m = 0; m < M; ++m) order[s].push_back({true, m});
      for (int64_t m = 0; m < M; ++m) order[s].push_back({false, m});
    } else {  // 1F1B: S-1-s warm-up forwards, then one forward and one backward in turn
      const int64_t warm = std::min<int64_t>(S - 1 - s, M);
      for (int64_t m = 0; m < warm; ++m) order[s].push_back({true, m});
      for (int64_t i = 0; i < M; ++i) {
        if (warm + i < M) order[s].push_back({true, warm + i});
        order[s].push_back({false, i});
      }
    }
  }
  std::vector<size_t> next(S, 0);
  std::vector<std::vector<char>> fdone(S, std::vector<char>(M, 0)), bdone = fdone;
  for (bool progress = true; progress;) {
    progress = false;
    // One op per stage per round, so that a consumer follows its producer closely in program
    // order (the producer's worker then sends as soon as the value exists).
    for (int s = 0; s < S; ++s) {
      if (next[s] < order[s].size()) {
        const Op op = order[s][next[s]];
        const bool ready = op.fwd ? (s == 0 || fdone[s - 1][op.m]) : (fdone[s][op.m] && (s == S - 1 || bdone[s + 1][op.m]));
        if (!ready) continue;
        if (op.fwd) {
          F(s, op.m);
          fdone[s][op.m] = 1;
        } else {
          B(s, op.m);
          bdone[s][op.m] = 1;
        }
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < S; ++s) PWM_CHECK_EQ(next[s], order[s].size());
  // Tied embedding: the head's part (last stage) plus the lookup's part (stage 0); every stage
  // applies the same update to its copy. The clipping norm sums every stage's share.
  const Value gE = call(0, "pw_add", {gEh, gL}, {1, head_n(cfg)})[0];
  std::vector<Value> sq;
  for (int s = 0; s < S; ++s) {
    std::vector<Value> in{gE};
    for (int l = pipe.layer_begin(s, L); l < pipe.layer_begin(s + 1, L); ++l) in.push_back(gl[l].back());
    sq.push_back(call(s, "pw_pipe_sqnorm", in, {1, s})[0]);
  }
  const Value total = call(0, "pw_sum", sq, {1, S})[0];
  for (int s = 0; s < S; ++s) {
    std::vector<Value> in{st[s][0], st[s][1], st[s][2], st[s][3], total, gE};
    for (int l = pipe.layer_begin(s, L); l < pipe.layer_begin(s + 1, L); ++l) in.push_back(gl[l].back());
    if (s == S - 1)
      for (auto& x : loss) in.push_back(x);
    for (auto& v : call(s, "pw_pipe_update", in, {1, s})) b.output(v);
  }
  return b.build();
}

Program single(const std::string& kernel, const Slice& s, const std::vector<Array>& in, std::vector<int64_t> attrs) {
  ProgramBuilder b(kernel);
  std::vector<Value> vals;
  for (auto& a : in) vals.push_back(b.param_like(a));
  for (auto& v : b.call(kernel, s, vals, std::move(attrs))) b.output(v);
  return b.build();
}

}  // namespace

std::string run_training(const model::TrainConfig& cfg, const PathwaysOptions& o, Client& client, int num_islands,
                         double peak_gflops, bool resume) {
  const bool pipe = o.stages > 1;
  const int tp = pipe ? 1 : cfg.tp;
  const int devices = pipe ? o.stages : cfg.dp * cfg.tp;
  const std::string name = pipe ? fmt::format("pathways-pipeline-{}", o.schedule) : "pathways-" + o.granularity;
  model::TrainReport report(cfg, name, devices, peak_gflops, true);
  Trace trace(!cfg.trace.empty(), 0, 0);
  trace.process_name("controller (rank 0)");
  RunOptions ro;
  ro.sequential = o.sequential;
  auto run = [&](const Program& p, const std::vector<Array>& in, const std::string& what) {
    const int64_t t0 = now_us();
    auto out = client.run(p, in, ro);
    trace.span("dispatch " + what, "dispatch", t0, now_us());
    return out;
  };
  auto fetch = [&](const Array& a, const std::string& what) {
    const int64_t t0 = now_us();
    auto v = a.get<double>();
    trace.span("wait " + what, "wait", t0, now_us());
    return v;
  };

  std::vector<Slice> slices;
  if (pipe)
    for (int s = 0; s < o.stages; ++s) slices.push_back(client.allocate(1, {}, s % num_islands));
  else
    slices.push_back(client.allocate(devices, {cfg.dp, cfg.tp}));
  std::vector<State> states;
  for (auto& sl : slices) states.push_back(run(single(resume ? "pw_load" : "pw_init", sl, {}, {tp}), {}, "init"));
  const int64_t first = static_cast<int64_t>(states[0][3].get<int64_t>()[0]);
  if (resume) fmt::print("[{}] resumed from {} at step {}\n", name, cfg.ckpt, first);

  // The step program (built once; lowered once; each run sends only ids and handles).
  Program step_prog;
  if (pipe) {
    step_prog = pipeline_program(cfg, o, slices, states);
  } else if (o.granularity == "fused") {
    step_prog = single("pw_fused_step", slices[0], states[0], {tp});
  } else if (o.granularity == "chained") {
    ProgramBuilder b("chained-step");
    std::vector<Value> st;
    for (auto& a : states[0]) st.push_back(b.param_like(a));
    auto out = step_graph<Value>(cfg, tp, st, [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      return b.call(k, slices[0], in, std::move(at));
    });
    for (auto& v : out) b.output(v);
    step_prog = b.build();
  }
  auto run_step = [&](const std::vector<State>& cur) -> std::vector<Array> {
    if (o.granularity == "opbyop" && !pipe)
      return step_graph<Array>(cfg, tp, cur[0], [&](const std::string& k, std::vector<Array> in, std::vector<int64_t> at) {
        return client.call(k, slices[0], in, std::move(at), ro);
      });
    std::vector<Array> in;
    for (auto& s : cur) in.insert(in.end(), s.begin(), s.end());
    return run(step_prog, in, "step");
  };

  // A full-model view for evaluation, hashing and checkpoints (the pipeline merges its stages).
  auto merged = [&](size_t which) -> Array {
    if (!pipe) return states[0][which];
    std::vector<Array> in;
    for (auto& s : states) in.push_back(s[which]);
    return run(single("pw_merge", slices[0], in, {1}), in, "merge")[0];
  };
  auto evaluate = [&]() { return fetch(run(single("pw_eval", slices[0], {merged(0)}, {tp}), {merged(0)}, "eval")[0], "val loss")[0]; };
  auto save = [&]() {
    std::vector<Array> in{merged(0), merged(1), merged(2), states[0][3]};
    run(single("pw_save", slices[0], in, {tp}), in, "checkpoint")[0].wait();
  };

  // Steps: two stay in flight while the controller reads the statistics of the one before. A
  // worker answers a fetch only between kernels, so with one in flight a fused step (one kernel)
  // would have its predecessor's statistics fetched only when it ends, and the next step
  // dispatched only after that round trip: the devices would idle for it every step.
  constexpr size_t kInFlight = 2;
  struct Pending {
    int64_t step;
    std::vector<Array> stats;  // per slice
  };
  std::deque<Pending> pending;
  double last_end_us = -1;  // the previous step's end on the workers' clock
  std::vector<double> bubbles;
  auto drain_one = [&]() {
    Pending p = std::move(pending.front());
    pending.pop_front();
    std::vector<std::vector<double>> per_slice;
    for (auto& a : p.stats) per_slice.push_back(fetch(a, fmt::format("step {}", p.step)));
    const auto& last = per_slice.back();
    double end_us = 0, first_busy = 0;
    for (auto& s : per_slice)
      for (size_t d = 0; d + kStats <= s.size(); d += kStats) {
        end_us = std::max(end_us, s[d + kEndUs]);
        first_busy = std::max(first_busy, s[d + kBusyMs]);
      }
    model::StepRecord r;
    r.step = p.step;
    r.step_ms = last_end_us < 0 ? first_busy : (end_us - last_end_us) * 1e-3;
    last_end_us = end_us;
    r.loss = last[kLoss];
    r.grad_norm = last[kGradNorm];
    r.lr = last[kLr];
    double busy_sum = 0;
    for (auto& s : per_slice)
      for (size_t d = 0; d + kStats <= s.size(); d += kStats) {
        const double busy = std::min(s[d + kBusyMs], r.step_ms);
        r.compute_ms.push_back(busy - s[d + kCommMs]);
        r.comm_ms.push_back(s[d + kCommMs] + (r.step_ms - busy));  // communication or waiting for dispatch
        r.wait_ms.push_back(r.step_ms - busy);
        busy_sum += busy;
      }
    if (pipe) bubbles.push_back(1.0 - busy_sum / static_cast<double>(r.compute_ms.size()) / r.step_ms);
    report.step(r);
  };
  for (int64_t step = first; step < cfg.steps; ++step) {
    auto out = run_step(states);
    Pending p{step, {}};
    for (size_t s = 0; s < states.size(); ++s) {
      states[s] = std::vector<Array>(out.begin() + s * 5, out.begin() + s * 5 + 4);
      p.stats.push_back(out[s * 5 + 4]);
    }
    pending.push_back(std::move(p));
    if (pending.size() > kInFlight) drain_one();
    if (step == cfg.kill_step) ::raise(SIGKILL);  // testing hook: the controller dies mid-run
    const int64_t done = step + 1;
    const bool eval_now = cfg.eval_every > 0 && done % cfg.eval_every == 0 && done != cfg.steps;
    const bool ckpt_now = !cfg.ckpt.empty() && cfg.ckpt_every > 0 && done % cfg.ckpt_every == 0 && done != cfg.steps;
    if (eval_now || ckpt_now) {
      while (!pending.empty()) drain_one();
      if (eval_now) report.validation(step, evaluate());
      if (ckpt_now) save();
      last_end_us = -1;  // the pause is not a step
    }
  }
  while (!pending.empty()) drain_one();
  report.validation(cfg.steps - 1, evaluate());
  if (!cfg.ckpt.empty()) save();
  auto hv = run(single("pw_hash", slices[0], {merged(0)}, {tp}), {merged(0)}, "hash")[0].get<int64_t>();
  uint64_t hash;
  std::memcpy(&hash, hv.data(), sizeof(hash));
  if (pipe && !bubbles.empty()) {
    report.set_extra("bubble", median(bubbles));
    report.set_extra("bubble_bound", static_cast<double>(o.stages - 1) / static_cast<double>(cfg.microbatches + o.stages - 1));
  }
  if (!cfg.trace.empty()) {
    // Every worker's kernel spans plus the controller's dispatch and wait rows.
    std::vector<std::string> fragments{trace.fragment()};
    const int64_t words = 1 << 20;  // 8 MiB of trace per worker at most
    for (auto& sl : slices) {
      auto all = run(single("pw_trace", sl, {}, {tp, words}), {}, "trace")[0].get<int64_t>();
      for (size_t d = 0; d + words <= all.size(); d += words)
        fragments.emplace_back(reinterpret_cast<const char*>(&all[d + 1]), static_cast<size_t>(all[d]));
    }
    write_trace_file(cfg.trace, fragments);
  }
  const std::string h = model::hash_hex(hash);
  report.finish(h);
  return h;
}

}  // namespace pwm::pathways::train
