// Helpers shared by the model tests: small configs, random tokens, a simulated tp group.
#pragma once

#include <barrier>
#include <cstdint>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "model/config.h"
#include "model/transformer.h"

namespace pwm::model::testing {

inline Config tiny_config() {
  Config c;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.head_dim = 4;
  c.d_ff = 24;
  c.vocab = 20;
  c.seq_len = 6;
  c.z_loss = 0.05;  // large enough that the z-loss term matters in the gradient check
  c.seed = 7;
  return c;
}

// [B, T+1] tokens in [0, V), deterministic in `seed`.
inline std::vector<int32_t> random_tokens(const Config& c, int64_t B, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(B * (c.seq_len + 1)));
  for (auto& x : t) x = dist(rng);
  return t;
}

// Runs fn(rank) for rank 0..n-1 on n threads and joins them (ranks simulated as threads).
inline void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back(fn, r);
  for (auto& t : th) t.join();
}

// tp ranks simulated as threads in lockstep: every rank calls reduce(rank, data, n) in the same
// order; the sum is formed in rank order (in S) and written back to every rank's buffer.
template <typename S>
class SimTpGroup {
 public:
  explicit SimTpGroup(int n) : n_(n), bar_(n), ptrs_(n) {}
  void reduce(int rank, S* data, size_t count) {
    ptrs_[rank] = data;
    bar_.arrive_and_wait();
    if (rank == 0) {
      sum_.assign(count, S(0));
      for (int r = 0; r < n_; ++r)
        for (size_t i = 0; i < count; ++i) sum_[i] += ptrs_[r][i];
      for (int r = 0; r < n_; ++r) std::copy(sum_.begin(), sum_.end(), ptrs_[r]);
    }
    bar_.arrive_and_wait();
  }
  TpReduce<S> callback(int rank) {
    return [this, rank](S* d, size_t c) { reduce(rank, d, c); };
  }
  // Runs fn(rank) on n threads and joins them.
  void run(const std::function<void(int)>& fn) { run_threads(n_, fn); }

 private:
  int n_;
  std::barrier<> bar_;
  std::vector<S*> ptrs_;
  std::vector<S> sum_;
};

}  // namespace pwm::model::testing
