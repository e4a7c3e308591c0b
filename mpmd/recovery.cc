// --spare-workers: the controller's side of a worker's loss (pathways_train) (docs/failures.md, "Recovery in the
// job"). The runtime has already declared the worker lost (its liveness), remapped its slice
// onto a spare device, cancelled the runs it had a part in and failed their outputs; the trainer
// hears of it as a failed fetch of a step's statistics and makes the state whole again here.
//
// Why the run ends on the bits of a run without the loss: the step's program is the same one,
// on the same state, with the same batches (a function of the seed, the step and the replica),
// only on another physical device. The state is rolled back to the input of the oldest step in
// flight (its handles were kept: the arrays stayed in the surviving workers' object stores), and
// every replica holds the same bits, so a healthy replica's copy is the lost one's. With no
// healthy replica left, the newest checkpoint of this run (or the initial state) and a replay of
// the steps since give the same state again. With no spare left for a replica's slice, the run
// goes on without that replica, on the same global batch (drop_lost_replicas): the steps after
// are a run's of one replica fewer, resumed from the same state.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <set>

#include "common/time.h"
#include "mpmd/trainer.h"

namespace pwm::mpmd {

Trainer::ArrayState Trainer::copy_state(const ArrayState& from, int to) {
  // A node on `to` reading arrays of another slice: the lowering sends them worker to worker.
  dataflow::Builder b("copy_state");
  std::vector<dataflow::Value> in;
  for (const Array& a : from.list()) in.push_back(b.param(a.slice(), rt_.slice_size(a.slice()), a.spec()));
  for (auto& v : b.call(names_("copy_state"), to, rt_.slice_size(to), in, {cfg_.mesh.tp})) b.output(v);
  return ArrayState::from(rt_.execute(*rt_.load(b.build()), from.list(), "restore"));
}

std::string Trainer::drop_lost_replicas(std::vector<ArrayState>& st, const std::string& why) {
  // Only dense replicas of one slice each (a pipeline never gets here: survive_without_spare is
  // off for it; expert islands refuse --spare-workers).
  std::vector<size_t> keep;
  for (size_t s = 0; s < slices_.size(); ++s)
    if (!rt_.lost(slices_[s])) keep.push_back(s);
  const int dropped = R_ - static_cast<int>(keep.size());
  const int64_t split = static_cast<int64_t>(keep.size()) * cfg_.mesh.dp * cfg_.workload.microbatches;
  if (keep.empty() || cfg_.workload.global_batch % split != 0)
    throw Error(fmt::format("{}; no spare device is left for it and {}: cannot go on without it (--spare-workers adds "
                            "spares)",
                            why,
                            keep.empty() ? std::string("no other replica is left")
                                         : fmt::format("--batch {} does not split into the {} replica(s) left x --dp {} "
                                                       "x --microbatches {}",
                                                       cfg_.workload.global_batch, keep.size(), cfg_.mesh.dp,
                                                       cfg_.workload.microbatches)));
  std::vector<int> slices;
  std::vector<ArrayState> states;
  std::vector<std::vector<int>> devices;
  for (size_t s : keep) {
    slices.push_back(slices_[s]);
    states.push_back(std::move(st[s]));
    devices.push_back(slice_devices_[s]);
  }
  slices_ = std::move(slices);
  st = std::move(states);
  slice_devices_ = std::move(devices);
  // The same global batch, split R' ways: each replica's share and gradient scale, on the
  // controller (the kernels' signatures) and on every device left, are a run's with R' replicas.
  R_ = static_cast<int>(keep.size());
  cfg_.mesh.replicas = R_;
  sh_ = programs::Shapes(cfg_, programs::PipelineShape{S_});
  PWM_CHECK(reshape_ != nullptr, "pathways_train: no shapes hook for a run of fewer replicas");
  reshape_(R_);
  std::vector<Array> done;
  for (int sl : slices_) done.push_back(rt_.call(names_("set_replicas"), sl, {}, {cfg_.mesh.tp, R_})[0]);
  for (const Array& a : done) rt_.wait(a);
  programs_.clear();  // (they name the slices and the replicas of before)
  replicas_dropped_ += dropped;
  return fmt::format("no spare left: going on with {} replica(s), {} fewer, on the same global batch of {}", R_, dropped,
                     cfg_.workload.global_batch);
}

std::optional<std::vector<size_t>> Trainer::same_stage(const std::vector<size_t>& moved,
                                                       const std::vector<size_t>& healthy) const {
  // Slice r * S + s is replica r's stage s (a pipeline's stage holds its own layers' state: only
  // the same stage of another replica has it).
  std::vector<size_t> from;
  for (size_t m : moved) {
    auto it = std::find_if(healthy.begin(), healthy.end(), [&](size_t h) { return h % S_ == m % S_; });
    if (it == healthy.end()) return std::nullopt;
    from.push_back(*it);
  }
  return from;
}

bool Trainer::recover(const std::string& why) {
  if (cfg_.mpmd.spare_workers == 0 || pending_.empty()) return false;
  bool lost = false;
  for (int sl : slices_) lost = lost || rt_.lost(sl);
  std::vector<size_t> moved, healthy;  // the slices on other devices than their state's, the others
  auto split = [&] {
    moved.clear();
    healthy.clear();
    for (size_t s = 0; s < slices_.size(); ++s) (rt_.devices(slices_[s]) != slice_devices_[s] ? moved : healthy).push_back(s);
  };
  split();
  if (moved.empty() && !lost) return false;  // not a lost device: the caller rethrows
  const double t0 = now_s();
  const int64_t from = pending_.front().step;
  std::vector<int64_t> redo;
  for (const Pending& p : pending_) redo.push_back(p.step);
  std::vector<ArrayState> st = std::move(pending_.front().inputs);
  pending_.clear();  // (their outputs failed; what they held on the survivors is freed)
  std::string source, fewer;
  if (lost) {  // (then the slices moved and healthy are counted again among those left)
    fewer = drop_lost_replicas(st, why);
    split();
  }
  if (moved.empty()) {
    source = "the replicas left (nothing to restore)";
  } else if (std::optional<std::vector<size_t>> donors = same_stage(moved, healthy)) {
    std::set<size_t> replicas;
    for (size_t i = 0; i < moved.size(); ++i) {
      st[moved[i]] = copy_state(st[(*donors)[i]], slices_[moved[i]]);
      replicas.insert((*donors)[i] / static_cast<size_t>(S_));
    }
    source = fmt::format("replica {}'s memory", fmt::join(replicas, " and "));
  } else {
    const bool ckpt = saved_step_ >= 0;
    st = init_states(slices_, ckpt, Init::kRecovery);
    source = ckpt ? fmt::format("the checkpoint of step {} ({})", saved_step_, cfg_.outputs.ckpt) : "the initial state";
  }
  states_ = std::move(st);
  if (step_is_one_program()) step_ = rt_.load(step_program());
  // (Waits for the restore: a restored slice's outputs complete when its copy or load has run.)
  for (size_t s : moved) rt_.wait(states_[s].params);
  const int64_t restored_at = rt_.get<int64_t>(states_[moved.empty() ? 0 : moved.front()].step, "restore")[0];
  const double t_restore = now_s() - t0;
  // The steps between the state restored and the oldest step in flight, run again unrecorded
  // (already reported), then the steps that were in flight.
  for (int64_t s = restored_at; s < from; ++s) launch(s, false);
  if (restored_at < from) rt_.wait(states_[0].step);
  std::vector<std::string> where;
  for (size_t s : moved) {
    where.push_back(fmt::format("slice {} from device(s) {} to {}", s, fmt::join(slice_devices_[s], ","),
                                fmt::join(rt_.devices(slices_[s]), ",")));
    slice_devices_[s] = rt_.devices(slices_[s]);
  }
  const double total = now_s() - t0;
  if (!fewer.empty()) where.insert(where.begin(), fewer);
  fmt::print("[{}] recovered at step {}: {}; {}; state restored from {} in {:.2f} s, {} step(s) replayed in {:.2f} s; "
             "step(s) {}..{} run again\n",
             run_name(cfg_, be_.model()), from, why, fmt::join(where, ", "), source, t_restore, from - restored_at, total - t_restore,
             redo.front(), redo.back());
  std::fflush(stdout);
  recovery_s_.push_back(total);
  recovery_steps_.push_back(static_cast<double>(from - restored_at + static_cast<int64_t>(redo.size())));
  for (int64_t s : redo) launch(s);
  pause();
  return true;
}

}  // namespace pwm::mpmd
