// Small order statistics for timing reports.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace pwm {

// The q-quantile (0..1) with linear interpolation; 0 for an empty input.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

inline double median(const std::vector<double>& v) { return quantile(v, 0.5); }

// min / median / max over ranks, and which rank holds the max (the straggler).
struct RankSummary {
  double min = 0, median = 0, max = 0;
  int argmax = 0;
};

inline RankSummary summarize_ranks(const std::vector<double>& per_rank) {
  RankSummary s;
  if (per_rank.empty()) return s;
  auto mx = std::max_element(per_rank.begin(), per_rank.end());
  s.max = *mx;
  s.argmax = static_cast<int>(mx - per_rank.begin());
  s.min = *std::min_element(per_rank.begin(), per_rank.end());
  s.median = median(per_rank);
  return s;
}

}  // namespace pwm
