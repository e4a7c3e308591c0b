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

namespace {
// Bruck's step `bit` sends the blocks whose index (relative to the rank) has that bit set.
int bruck_blocks(int p, int bit) {
  int k = 0;
  for (int i = 0; i < p; ++i) k += (i >> bit) & 1;
  return k;
}
}  // namespace

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

double CostModel::alltoall_us(Algorithm a, size_t bytes_per_peer, int p) const {
  if (p <= 1) return 0.0;
  const double m = static_cast<double>(bytes_per_peer);
  const double beta = beta_ns_per_byte * 1e-3, copy = 0.5 * gamma_ns_per_byte * 1e-3;
  switch (a) {
    case Algorithm::kPairwise:
    case Algorithm::kLinear:
      return (p - 1) * (alpha_us + m * beta);
    case Algorithm::kBruck: {
      double t = 0, packed = 0;
      for (int bit = 0; (1 << bit) < p; ++bit) {
        const int b = bruck_blocks(p, bit);
        t += alpha_us + b * m * beta;
        packed += b > 1 ? b : 0;  // a lone block is sent unpacked
      }
      return t + (packed + p) * m * copy;
    }
    default:
      return 1e30;
  }
}

Algorithm CostModel::pick_alltoall(size_t bytes_per_peer, int p, bool equal_counts) const {
  if (!equal_counts) return Algorithm::kPairwise;
  return alltoall_us(Algorithm::kBruck, bytes_per_peer, p) < alltoall_us(Algorithm::kPairwise, bytes_per_peer, p)
             ? Algorithm::kBruck
             : Algorithm::kPairwise;
}

}  // namespace pwm::collectives
