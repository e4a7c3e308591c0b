#include "pathways/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstring>
#include <deque>
#include <functional>
#include <map>

#include "common/check.h"
#include "common/stats.h"
#include "common/time.h"
#include "common/trace.h"

#include <unistd.h>
#include "model/full_state.h"
#include "model/params.h"
#include "model/train_report.h"
#include "pathways/train/step_io.h"
#include "pathways/train/step_program.h"

namespace pwm::pathways::train {

namespace {

using ArrayState = State<Array>;

Program single(const std::string& kernel, const Slice& s, const std::vector<Array>& in, std::vector<int64_t> attrs) {
  ProgramBuilder b(kernel);
  std::vector<Value> vals;
  for (auto& a : in) vals.push_back(b.param_like(a));
  for (auto& v : b.call(kernel, s, vals, std::move(attrs))) b.output(v);
  return b.build();
}

}  // namespace

std::string run_training(const model::TrainConfig& cfg, const PathwaysOptions& o, Client& client, int num_islands,
                         double peak_gflops, bool resume, const KernelNames& names) {
  const bool pipe = o.stages > 1;
  const int R = cfg.replicas;  // > 1: replicas exchanging gradients (a slice each, or a pipeline each)
  const int S = o.stages;      // slices per replica
  const int tp = cfg.tp;
  const int devices = cfg.dp * cfg.tp;  // per slice (a pipeline: per stage)
  const Shapes sh(cfg, PipelineShape{o.stages});
  const std::string name = pipe ? fmt::format("pathways-pipeline-{}", o.schedule) : "pathways-" + o.granularity;
  model::TrainReport report(cfg, name, devices * R * o.stages, peak_gflops, true);
  Trace trace(!cfg.trace.empty(), 0, 0);
  {
    char host[256] = {};
    gethostname(host, sizeof host - 1);  // the workers' rows name their hosts too (device.cc)
    trace.process_name(fmt::format("controller (rank 0) on {}", host));
  }
  RunOptions ro;
  ro.sequential = o.sequential;
  // The pipeline's schedule is the order of each stage's nodes: run in that order, a stage holds
  // the activations its schedule keeps (1F1B: at most S - s micro-batches), not all M.
  ro.in_order = pipe;
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

  // Slices in replica-major order: slice r x S + s is replica r's stage s.
  std::vector<Slice> slices;
  if (pipe)
    // One island per stage (of every replica) when there are islands enough; else, with
    // replicas, replica r's stages on island r (mod the islands, as the replicas' slices below);
    // else stage s on island s while there are islands, the stages beyond on the least loaded
    // devices of any island (island s mod K could be a one-device island already holding a
    // stage while another island's devices idle).
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < S; ++s) {
        const int i = r * S + s;
        const int island = R * S <= num_islands ? i : R > 1 ? r % num_islands : (s < num_islands ? s : -1);
        slices.push_back(client.allocate(devices, {cfg.dp, cfg.tp}, island));
      }
  else if (R > 1)  // replica r on island r (mod the islands: one island holds several in tests)
    for (int r = 0; r < R; ++r) slices.push_back(client.allocate(devices, {cfg.dp, cfg.tp}, r % num_islands));
  else
    slices.push_back(client.allocate(devices, {cfg.dp, cfg.tp}));
  std::vector<ArrayState> states;
  for (auto& sl : slices)
    states.push_back(ArrayState::from(run(single(names(resume ? "load" : "init"), sl, {}, {tp}), {}, "init")));
  const int64_t first = static_cast<int64_t>(states[0].step.get<int64_t>()[0]);
  if (resume) fmt::print("[{}] resumed from {} at step {}\n", name, cfg.ckpt, first);

  // The step program (built once; lowered once; each run sends only ids and handles).
  Program step_prog;
  if (pipe) {
    step_prog = pipeline_program(sh, names, o.schedule, slices, states);
  } else if (R > 1) {
    step_prog = replica_program(sh, names, o.granularity, slices, states);
  } else if (o.granularity == "fused") {
    step_prog = single(names("fused_step"), slices[0], states[0].list(), {tp});
  } else if (o.granularity == "chained") {
    ProgramBuilder b("chained-step");
    std::vector<Value> st;
    for (auto& a : states[0].list()) st.push_back(b.param_like(a));
    auto out = trace_step<Value>(sh, names, tp, State<Value>::from(st), [&](const std::string& k, std::vector<Value> in, std::vector<int64_t> at) {
      return b.call(k, slices[0], in, std::move(at));
    });
    for (auto& v : out) b.output(v);
    step_prog = b.build();
  }
  auto run_step = [&](const std::vector<ArrayState>& cur) -> std::vector<Array> {
    if (o.granularity == "opbyop" && !pipe)
      return trace_step<Array>(sh, names, tp, cur[0], [&](const std::string& k, std::vector<Array> in, std::vector<int64_t> at) {
        return client.call(k, slices[0], in, std::move(at), ro);
      });
    std::vector<Array> in;
    for (auto& s : cur)
      for (auto& a : s.list()) in.push_back(a);
    return run(step_prog, in, "step");
  };

  // A full-model view for evaluation, hashing and checkpoints (the pipeline merges its stages).
  // (Replica r's; every replica holds the same bits, checked at the end.)
  auto merged = [&](Array ArrayState::*which, int r = 0) -> Array {
    if (!pipe) return states[static_cast<size_t>(r)].*which;
    std::vector<Array> in;
    for (int s = 0; s < S; ++s) in.push_back(states[static_cast<size_t>(r * S + s)].*which);
    return run(single(names("merge"), slices[static_cast<size_t>(r * S)], in, {tp}), in, "merge")[0];
  };
  auto evaluate = [&]() {
    if (R > 1) {  // every replica evaluates its rows of its own (identical) parameters; replica 0 adds
      std::vector<Array> params;
      for (int r = 0; r < R; ++r) params.push_back(merged(&ArrayState::params, r));
      ProgramBuilder b("eval-replicas");
      std::vector<Value> sums;
      for (int r = 0; r < R; ++r)
        sums.push_back(b.call(names("eval"), slices[static_cast<size_t>(r * S)], {b.param_like(params[static_cast<size_t>(r)])}, {tp, r})[0]);
      b.output(b.call(names("val_total"), slices[0], sums, {tp, R})[0]);
      return fetch(run(b.build(), params, "eval")[0], "val loss")[0];
    }
    const Array params = merged(&ArrayState::params);
    return fetch(run(single(names("eval"), slices[0], {params}, {tp}), {params}, "eval")[0], "val loss")[0];
  };
  auto save = [&]() {
    const ArrayState full{merged(&ArrayState::params), merged(&ArrayState::m), merged(&ArrayState::v), states[0].step};
    run(single(names("save"), slices[0], full.list(), {tp}), full.list(), "checkpoint")[0].wait();
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
  std::vector<double> bubbles, exposed, tails;
  auto drain_one = [&]() {
    Pending p = std::move(pending.front());
    pending.pop_front();
    std::vector<std::vector<double>> per_slice;
    for (auto& a : p.stats) per_slice.push_back(fetch(a, fmt::format("step {}", p.step)));
    std::vector<StepStats> devices;  // every device of every slice
    for (auto& s : per_slice)
      for (const StepStats& d : StepStats::read_all(s)) devices.push_back(d);
    const StepStats last = StepStats::read_all(per_slice.back()).front();  // the loss is on the last slice
    double end_us = 0, first_busy = 0;
    for (const StepStats& d : devices) {
      end_us = std::max(end_us, d.end_us);
      first_busy = std::max(first_busy, d.busy_ms);
    }
    model::StepRecord r;
    r.step = p.step;
    r.step_ms = last_end_us < 0 ? first_busy : (end_us - last_end_us) * 1e-3;
    last_end_us = end_us;
    r.loss = last.loss;
    r.grad_norm = last.grad_norm;
    r.lr = last.lr;
    double busy_sum = 0;
    for (const StepStats& d : devices) {
      const double busy = std::min(d.busy_ms, r.step_ms);
      r.compute_ms.push_back(busy - d.comm_ms);
      r.comm_ms.push_back(d.comm_ms + (r.step_ms - busy));  // communication or waiting for dispatch
      r.wait_ms.push_back(r.step_ms - busy);
      busy_sum += busy;
    }
    if (pipe) bubbles.push_back(1.0 - busy_sum / static_cast<double>(r.compute_ms.size()) / r.step_ms);
    if (R > 1 && !pipe) {  // (the pipeline's update does not time the exchange)
      double e = 0;
      for (const StepStats& d : devices) e += d.xchg_exposed_ms;
      exposed.push_back(e / static_cast<double>(devices.size()));
      // The exchange's tail: from the end of the last island's backward (every island's gradients
      // exist) to each device's update, on the controller's clock; a slower island's backward is
      // not in it.
      double last_bwd = 0, tail = 0;
      for (const StepStats& d : devices) last_bwd = std::max(last_bwd, d.bwd_end_us);
      for (const StepStats& d : devices) tail += std::max(0.0, d.update_start_us - last_bwd) * 1e-3;
      tails.push_back(tail / static_cast<double>(devices.size()));
    }
    report.step(r);
    // A failed metrics write (a full disk) ends the run now rather than after the last step; the
    // controller's error ends the job (run_mpi_main) and nothing is left under the final name.
    if (report.failed()) throw Error(report.error());
  };
  for (int64_t step = first; step < cfg.steps; ++step) {
    const auto out = run_step(states);
    PWM_CHECK_EQ(out.size(), states.size() * StepOutputs<Array>::kCount);
    Pending p{step, {}};
    for (size_t s = 0; s < states.size(); ++s) {  // each slice's StepOutputs, in slice order
      const auto o = StepOutputs<Array>::from(std::span(out).subspan(s * StepOutputs<Array>::kCount, StepOutputs<Array>::kCount));
      states[s] = o.state;
      p.stats.push_back(o.stats);
    }
    pending.push_back(std::move(p));
    if (pending.size() > kInFlight) drain_one();
    // Testing hooks, as spmd_train's: --kill-rank 0 is the controller, which dies mid-run (a
    // worker kills itself inside its step kernel: step_kernels.cc); --step-sleep-ms paces the
    // dispatch so that an outside kill finds the run in progress.
    if (step == cfg.kill_step && cfg.kill_rank == 0) ::raise(SIGKILL);
    if (cfg.step_sleep_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(cfg.step_sleep_ms));
      last_end_us = -1;  // the pause is not a step (as in spmd_train)
    }
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
  const Array final_params = merged(&ArrayState::params);
  auto hv = run(single(names("hash"), slices[0], {final_params}, {tp}), {final_params}, "hash")[0].get<int64_t>();
  uint64_t hash;
  std::memcpy(&hash, hv.data(), sizeof(hash));
  // Replicas: no parameter was ever sent between the islands; every island must still hold the
  // same bits (the same summed gradients, the same update). Checked once, at the end of the run.
  for (int r = 1; r < R; ++r) {
    const Array pr = merged(&ArrayState::params, r);
    auto h = run(single(names("hash"), slices[static_cast<size_t>(r * S)], {pr}, {tp}), {pr}, "hash")[0].get<int64_t>();
    if (h[0] != hv[0])
      throw Error(fmt::format("replica {}'s parameters differ from replica 0's after {} steps (the islands' updates "
                              "diverged): a bug in the exchange", r, cfg.steps));
  }
  if (pipe && !bubbles.empty()) {
    report.set_extra("bubble", median(bubbles));
    report.set_extra("bubble_bound", static_cast<double>(o.stages - 1) / static_cast<double>(cfg.microbatches + o.stages - 1));
  }
  // Memory: every worker's peak resident set, and the model state each device holds (parameters
  // and the two AdamW moments of its shard).
  int64_t peak_rss = 0;
  for (auto& sl : slices)
    for (int64_t b : run(single(names("memory"), sl, {}, {tp}), {}, "memory")[0].get<int64_t>()) peak_rss = std::max(peak_rss, b);
  report.set_extra("peak_rss_bytes", static_cast<double>(peak_rss));
  {
    // Per slice (a pipeline: per stage), the largest of its workers' object-store high-water
    // marks and of their intermediates (activations, gradients in flight) alive at once.
    std::map<int, WorkerStats> by_rank;
    for (const WorkerStats& w : client.stats()) by_rank[w.rank] = w;
    std::vector<double> store, inter;
    for (auto& sl : slices) {
      uint64_t hw = 0, in = 0;
      for (int d : sl.devices()) {
        const WorkerStats& w = by_rank[d + 1];  // device d is world rank d + 1
        hw = std::max(hw, w.high_water_bytes);
        in = std::max(in, w.peak_intermediate_bytes);
      }
      store.push_back(static_cast<double>(hw));
      inter.push_back(static_cast<double>(in));
    }
    report.set_extra_list("peak_store_bytes", store);
    report.set_extra_list("peak_intermediate_bytes", inter);
  }
  if (pipe) {  // the stage layout: S slices of dp x tp devices per replica, and the island of each
    report.set_extra("stages", o.stages);
    report.set_extra("stage_dp", cfg.dp);
    report.set_extra("stage_tp", cfg.tp);
    std::vector<double> isl;
    for (auto& sl : slices) isl.push_back(sl.island());
    report.set_extra_list("stage_islands", isl);
  }
  // (A pipeline stage's state arrays are the whole layout's size: sh.total(1).)
  report.set_extra("state_bytes", 3.0 * static_cast<double>(sh.total(tp)) * sizeof(float));
  if (R > 1) {
    // Bytes between islands per step: every device sends each piece and its loss to its peer in
    // each other island.
    int64_t piece_bytes = 0;
    for (int i = 0; i < sh.plan(tp).num_pieces(); ++i) piece_bytes += sh.piece(tp, i) * static_cast<int64_t>(sizeof(float));
    report.set_extra("dcn_bytes_per_step",
                     static_cast<double>(R) * (R - 1) * devices * static_cast<double>(piece_bytes + sizeof(double)));
    if (!exposed.empty()) report.set_extra("xchg_exposed_ms", median(exposed));
    if (!tails.empty()) report.set_extra("xchg_tail_ms", median(tails));
  }
  if (!cfg.trace.empty()) {
    // Every worker's kernel spans plus the controller's dispatch and wait rows.
    std::vector<std::string> fragments{trace.fragment()};
    const int64_t words = 1 << 20;  // 8 MiB of trace per worker at most
    for (auto& sl : slices) {
      auto all = run(single(names("trace"), sl, {}, {tp, words}), {}, "trace")[0].get<int64_t>();
      for (size_t d = 0; d + words <= all.size(); d += words)
        fragments.emplace_back(reinterpret_cast<const char*>(&all[d + 1]), static_cast<size_t>(all[d]));
    }
    write_trace_file(cfg.trace, fragments, "--trace");
  }
  const std::string h = model::hash_hex(hash);
  report.finish(h);
  return h;
}

}  // namespace pwm::pathways::train
