#include "collectives/cost_model.h"

#include <algorithm>
#include <cmath>

#include "common/env.h"

namespace pwm::collectives {

CostModel CostModel::from_env() {
  CostModel m;
  m.alpha_us = env_double("PWM_COLL_ALPHA_US", m.alpha_us);
  m.beta_ns_per_byte = env_double("PWM_COLL_BETA_NS_PER_B", m.beta_ns_per_byte);
  m.gamma_ns_per_byte = env_double("PWM_COLL_GAMMA_NS_PER_B", m.gamma_ns_per_byte);
  return m;
}

double CostModel::allreduce_us(Algorithm a, size_t bytes, int p, size_t seg_bytes) const {
  if (p <= 1) return 0.0;
  const double N = static_cast<double>(bytes);
  const double beta = beta_ns_per_byte * 1e-3, gamma = gamma_ns_per_byte * 1e-3;
  int p2 = 1, logp2 = 0;
  while (p2 * 2 <= p) {
    p2 *= 2;
    ++logp2;
  }
  // Non-power-of-two groups pay one full-vector exchange in and one out.
  const double fold = p2 == p ? 0.0 : 2.0 * (alpha_us + N * beta) + N * gamma;
  switch (a) {
    case Algorithm::kRing: {
      const double chunk = N / p;
      const double segs = std::max(1.0, std::ceil(chunk / std::max<double>(seg_bytes, 1)));
      // Pipelined: a segment is reduced while the next one is on the wire, so only one
      // segment's reduction per step is exposed.
      const double exposed = std::min(N, std::max<double>(seg_bytes, 1) * p);
      return 2.0 * (p - 1) * segs * alpha_us + 2.0 * (p - 1) / p * N * beta + (p - 1.0) / p * exposed * gamma;
    }
    case Algorithm::kHalvingDoubling:
      return fold + 2.0 * logp2 * alpha_us + 2.0 * (p2 - 1.0) / p2 * N * beta +
             (p2 - 1.0) / p2 * N * gamma;
    case Algorithm::kRecursiveDoubling:
      return fold + logp2 * (alpha_us + N * beta + N * gamma);
    default:
      return 1e30;
  }
}

Algorithm CostModel::pick_allreduce(size_t bytes, int p, size_t seg_bytes) const {
  Algorithm best = Algorithm::kRecursiveDoubling;
  double best_t = allreduce_us(best, bytes, p, seg_bytes);
  for (Algorithm a : {Algorithm::kHalvingDoubling, Algorithm::kRing}) {
    double t = allreduce_us(a, bytes, p, seg_bytes);
    if (t < best_t) {
      best = a;
      best_t = t;
    }
  }
  return best;
}

}  // namespace pwm::collectives
