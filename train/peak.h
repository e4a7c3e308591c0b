// The GEMM peak MFU is measured against, per compute rank (docs/train.md, "MFU"):
//  - --peak-gflops when the user gives it (no probe runs);
//  - else the model-shape GEMM probe's rate (model/gemm_probe.h: the step's own products), on
//    every compute rank at once and averaged over them, at start-up and again at every pause of
//    the run (evaluation, checkpoint) and after the last step; the highest of these;
//  - in both cases raised to a step's achieved model FLOP rate per rank whenever that is higher,
//    so that MFU = achieved / peak can never exceed 100%, and source() then says the probe (or
//    --peak-gflops) was lower.
// No MPI here: the trainers average the ranks' rates (train/bootstrap.h gemm_peak, the trainers'
// probe_peak) and hand the results in.
#pragma once

#include <memory>
#include <string>

#include "model/gemm_probe.h"
#include "train/config.h"

namespace pwm::train {

// How long a probe through the run may take on each rank (it times at least one product, so a
// product longer than this makes the probe that long): a few tens of ms per pause.
constexpr double kPeakProbeBudgetS = 0.03;
// The start-up probe: every product twice. A first pass is cold (the GEMM library's buffers, the
// bf16 copies, the code): on the test model it came out at two thirds of the later probes' rate.
double startup_probe(model::GemmProbe& probe);

class Peak {
 public:
  static Peak given(double gflops);   // --peak-gflops
  static Peak probed(double gflops);  // the start-up probe's rate (mean over the compute ranks)

  // A later probe's rate (mean over the compute ranks): the peak rises to it if it is higher.
  void probe(double gflops);
  // A step's achieved model FLOP rate per compute rank (tokens/s x flops per token / ranks):
  // when it is above the peak, the peak becomes it; returns true then.
  bool achieved(double gflops);

  double gflops() const;
  // What gflops() is, in a few words: "model-shape GEMM, highest of 3 probes", "--peak-gflops",
  // "achieved step rate, above the model-shape GEMM's highest of 3 probes, 61.2 GFLOP/s", or
  // "achieved step rate, above --peak-gflops 10".
  std::string source() const;
  bool is_given() const { return given_ > 0; }
  int probes() const { return probes_; }
  double best_probe() const { return probe_; }  // 0 with --peak-gflops
  bool raised() const { return achieved_ > base(); }

 private:
  double base() const { return given_ > 0 ? given_ : probe_; }
  double given_ = 0, probe_ = 0, achieved_ = 0;
  int probes_ = 0;
};

// This rank's probe over the step of `cfg` (its tp shard and expert split, one micro-batch of
// cfg.micro_batch() sequences; a pipeline stage's device probes every layer's products and the
// head's, the same shapes as its own); null with --peak-gflops, where nothing is probed.
std::unique_ptr<model::GemmProbe> make_gemm_probe(const TrainConfig& cfg);

}  // namespace pwm::train
