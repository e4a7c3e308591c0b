// Recursive halving-doubling (Rabenseifner) and recursive doubling AllReduce, with the standard
// fix-up for groups that are not a power of two (MPICH's): with p2 the largest power of two
// <= n and rem = n - p2, ranks 2i and 2i+1 (i < rem) first combine, the even one sits out and
// gets the result at the end, and the remaining p2 ranks run the power-of-two algorithm under
// "new ranks".
//
// Determinism: every reduction puts the operand of the lower new rank first, so the two ranks
// of a pair compute the same bits even for max/min of signed zeros, and the result only depends
// on the group size and the algorithm.
//
// Steps of one rank run in sequence (each exchange depends on the previous one); these
// algorithms win on latency (log2 n exchanges), not on pipelining.
#include <algorithm>
#include <span>
#include <vector>

#include "collectives/communicator.h"

#include "collectives/algorithms.h"

namespace pwm::collectives::algo {

namespace {

using Id = Schedule::Id;
using Deps = Schedule::Deps;

struct Fold {
  int p2 = 1, rem = 0;
  int newrank = -1;  // -1: this rank sits out (folded into its odd neighbour)
  int real(int q) const { return q < rem ? 2 * q + 1 : q + rem; }
};

Fold make_fold(int r, int n) {
  Fold f;
  while (f.p2 * 2 <= n) f.p2 *= 2;
  f.rem = n - f.p2;
  if (r < 2 * f.rem)
    f.newrank = (r % 2 == 0) ? -1 : r / 2;
  else
    f.newrank = r - f.rem;
  return f;
}

// Fold-in: even ranks of the first 2*rem hand their vector to the odd neighbour, which reduces
// it into recv. Returns the buffer holding this rank's data for the main phase and the steps
// it must wait for.
const char* fold_in(Schedule& s, int r, const Fold& f, const void* send, void* recv, size_t count,
                    Deps& prev) {
  if (r >= 2 * f.rem) return static_cast<const char*>(send);
  if (f.newrank < 0) {
    Id sd = s.send(r + 1, send, count);
    // The result comes back into recv; when in place it must not overwrite what is being sent.
    s.recv(r + 1, recv, count, {sd});
    return nullptr;
  }
  void* tmp = s.scratch(count);
  Id rv = s.recv(r - 1, tmp, count);
  prev = {s.reduce(recv, tmp, send, count, {rv})};  // lower rank (r-1) first
  return static_cast<const char*>(recv);
}

void fold_out(Schedule& s, int r, const Fold& f, void* recv, size_t count, const Deps& prev) {
  if (r < 2 * f.rem && f.newrank >= 0) s.send(r - 1, recv, count, prev);
}

}  // namespace

void allreduce_recursive_doubling(Schedule& s, int r, int n, const void* send, void* recv,
                                  size_t count) {
  Fold f = make_fold(r, n);
  Deps prev;
  const char* cur = fold_in(s, r, f, send, recv, count, prev);
  if (f.newrank < 0) return;
  if (f.p2 == 1) {
    s.copy(recv, cur, count);
    return;
  }
  void* tmp = s.scratch(count);
  for (int mask = 1; mask < f.p2; mask <<= 1) {
    const int q = f.newrank ^ mask;
    const int peer = f.real(q);
    Id sd = s.send(peer, cur, count, prev);
    Id rv = s.recv(peer, tmp, count, prev);
    // Reducing into recv while it is being sent: wait for the send.
    const void* lo = f.newrank < q ? static_cast<const void*>(cur) : tmp;
    const void* hi = f.newrank < q ? static_cast<const void*>(tmp) : cur;
    prev = {s.reduce(recv, lo, hi, count, {sd, rv})};
    cur = static_cast<const char*>(recv);
  }
  fold_out(s, r, f, recv, count, prev);
}

void allreduce_halving_doubling(Schedule& s, int r, int n, const void* send, void* recv,
                                size_t count) {
  const size_t elem = s.elem();
  Fold f = make_fold(r, n);
  Deps prev;
  const char* cur = fold_in(s, r, f, send, recv, count, prev);
  if (f.newrank < 0) return;
  if (f.p2 == 1) {
    s.copy(recv, cur, count);
    return;
  }
  char* out = static_cast<char*>(recv);
  char* tmp = static_cast<char*>(s.scratch(count));
  // Reduce-scatter by recursive halving: each step keeps half of the current range.
  struct Level { size_t lo, hi, keep_lo, keep_hi; int peer; };
  std::vector<Level> levels;
  size_t lo = 0, hi = count;
  for (int mask = f.p2 / 2; mask >= 1; mask >>= 1) {
    const int q = f.newrank ^ mask;
    const int peer = f.real(q);
    const size_t mid = lo + (hi - lo) / 2;
    const bool low_half = (f.newrank & mask) == 0;
    const size_t klo = low_half ? lo : mid, khi = low_half ? mid : hi;
    const size_t glo = low_half ? mid : lo, ghi = low_half ? hi : mid;
    Id sd = s.send(peer, cur + glo * elem, ghi - glo, prev);
    Id rv = s.recv(peer, tmp + klo * elem, khi - klo, prev);
    const void* mine = cur + klo * elem;
    const void* theirs = tmp + klo * elem;
    const bool first = f.newrank < q;
    Id red = s.reduce(out + klo * elem, first ? mine : theirs, first ? theirs : mine, khi - klo, {rv});
    prev = {sd, rv, red};
    levels.push_back({lo, hi, klo, khi, peer});
    lo = klo;
    hi = khi;
    cur = out;
  }
  // All-gather by recursive doubling: undo the levels, exchanging kept halves.
  for (auto it = levels.rbegin(); it != levels.rend(); ++it) {
    const size_t olo = it->keep_lo == it->lo ? it->keep_hi : it->lo;
    const size_t ohi = it->keep_lo == it->lo ? it->hi : it->keep_lo;
    Id sd = s.send(it->peer, out + it->keep_lo * elem, it->keep_hi - it->keep_lo, prev);
    Id rv = s.recv(it->peer, out + olo * elem, ohi - olo, prev);
    prev = {sd, rv};
  }
  fold_out(s, r, f, recv, count, prev);
}

}  // namespace pwm::collectives::algo

namespace pwm::collectives {

double recursive_doubling_sum(std::span<const double> v) {
  const int n = static_cast<int>(v.size());
  if (n == 0) return 0.0;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  std::vector<double> w(static_cast<size_t>(p2));
  for (int q = 0; q < p2; ++q) w[static_cast<size_t>(q)] = q < rem ? v[2 * q] + v[2 * q + 1] : v[q + rem];
  for (int mask = 1; mask < p2; mask <<= 1) {
    std::vector<double> next(w.size());
    for (int q = 0; q < p2; ++q) {
      const int lo = std::min(q, q ^ mask), hi = std::max(q, q ^ mask);
      next[static_cast<size_t>(q)] = w[static_cast<size_t>(lo)] + w[static_cast<size_t>(hi)];
    }
    w = std::move(next);
  }
  return w[0];
}

}  // namespace pwm::collectives
