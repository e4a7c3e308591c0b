#include "train/peak.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/params.h"

namespace pwm::train {

Peak Peak::given(double gflops) {
  Peak p;
  p.given_ = gflops;
  return p;
}

Peak Peak::probed(double gflops) {
  Peak p;
  p.probe(gflops);
  return p;
}

void Peak::probe(double gflops) {
  ++probes_;
  probe_ = std::max(probe_, gflops);
}

bool Peak::achieved(double gflops) {
  const bool above = gflops > this->gflops();
  achieved_ = std::max(achieved_, gflops);
  return above;
}

double Peak::gflops() const { return std::max(base(), achieved_); }

std::string Peak::source() const {
  const std::string probes = fmt::format("highest of {} probe{}", probes_, probes_ == 1 ? "" : "s");
  if (!raised()) return is_given() ? "--peak-gflops" : "model-shape GEMM, " + probes;
  if (is_given()) return fmt::format("achieved step rate, above --peak-gflops {:g}", given_);
  return fmt::format("achieved step rate, above the model-shape GEMM's {}, {:.1f} GFLOP/s", probes, probe_);
}

double startup_probe(model::GemmProbe& probe) {
  probe.run(0);
  return probe.run(0);
}

std::unique_ptr<model::GemmProbe> make_gemm_probe(const TrainConfig& cfg) {
  if (cfg.exec.peak_gflops > 0) return nullptr;
  // Every tp rank's shard has the same shapes, and so has every expert-parallel rank's.
  const model::ParamLayout layout(cfg.model, 0, cfg.mesh.tp, 0, cfg.mesh.ep);
  return std::make_unique<model::GemmProbe>(layout, cfg.micro_batch());
}

}  // namespace pwm::train
