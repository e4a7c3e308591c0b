// Binomial trees (broadcast, reduce) and the dissemination barrier.
//
// Ranks are renumbered relative to the root (v = (r - root) mod n). In the broadcast, v
// receives from v - 2^k where 2^k is v's lowest set bit, then sends to v + 2^j for every
// 2^j < 2^k, largest first; the message is cut into segments so that a rank forwards segment j
// while receiving segment j+1. In the reduce, v receives from v + 2^j for increasing j while
// those exist, folds each in (its own data first: lower relative rank first, a fixed order),
// then sends to its parent.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace pwm::collectives::algo {

namespace {
using Id = Schedule::Id;
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

void broadcast_binomial(Schedule& s, int r, int n, void* buf, size_t count, int root, size_t seg) {
  if (n == 1 || count == 0) return;
  const size_t elem = s.elem();
  const int v = mod(r - root, n);
  int parent = -1;
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      parent = mod(v - mask + root, n);
      break;
    }
    mask <<= 1;
  }
  std::vector<int> children;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) children.push_back(mod(v + mask + root, n));
  seg = std::max<size_t>(seg, 1);
  char* b = static_cast<char*>(buf);
  for (size_t off = 0; off < count; off += seg) {
    const size_t len = std::min(seg, count - off);
    Id got = parent >= 0 ? s.recv(parent, b + off * elem, len) : Schedule::kNone;
    for (int c : children) s.send(c, b + off * elem, len, {got});
  }
}

void reduce_binomial(Schedule& s, int r, int n, const void* send, void* recv, size_t count, int root) {
  const int v = mod(r - root, n);
  if (n == 1) {
    s.copy(recv, send, count);
    return;
  }
  // The accumulator: recv on the root, scratch elsewhere; until the first child arrives the
  // rank's own data is read straight from send.
  void* acc = v == 0 ? recv : s.scratch(count);
  const void* cur = send;
  Schedule::Deps prev;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      s.send(mod(v - mask + root, n), cur, count, prev);
      return;
    }
    if (v + mask < n) {
      void* tmp = s.scratch(count);
      Id rv = s.recv(mod(v + mask + root, n), tmp, count);
      prev = {s.reduce(acc, cur, tmp, count, {rv, prev.empty() ? Schedule::kNone : prev[0]})};
      cur = acc;
    }
  }
  if (cur != recv) s.copy(recv, cur, count, prev);  // root without children (cannot happen for n>1)
}

void barrier_dissemination(Schedule& s, int r, int n) {
  Schedule::Deps prev;
  for (int d = 1; d < n; d <<= 1) {
    Id sd = s.send(mod(r + d, n), nullptr, 0, prev);
    Id rv = s.recv(mod(r - d, n), nullptr, 0, prev);
    prev = {sd, rv};
  }
}

}  // namespace pwm::collectives::algo
