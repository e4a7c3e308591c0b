// Ring algorithms: reduce-scatter, all-gather, and AllReduce as the two in sequence.
//
// Chunks and segments. The vector is cut into n chunks (one per rank; balanced when the count
// does not divide). Every transfer of a chunk is further cut into segments of `seg` elements, and
// dependencies are tracked per segment, so that in a given step segment j can be reduced while
// segment j+1 is still on the wire, and forwarded in the next step while segment j+1 is being
// reduced: a pipelined ring, as NCCL does, with no rounds to wait for.
//
// Reduce-scatter, step k (0 <= k < n-1): rank r sends chunk (r-k-1) mod n to rank r+1 and
// receives chunk (r-k-2) mod n from rank r-1 into a temporary, then reduces it with its own
// contribution into that chunk's destination. After n-1 steps rank r owns chunk r, reduced in
// the fixed order r+1, r+2, ..., r (mod n) around the ring: the order depends only on the chunk
// and the group, so results are bitwise reproducible.
// All-gather, step k: rank r sends chunk (r-k) mod n and receives chunk (r-k-1) mod n in place.
//
// Temporaries: two slots (even and odd steps) of one chunk each, so step k+1's receive does not
// overwrite data step k has not reduced yet; the dependency on step k-1's reduce of the same
// segment in the same slot is explicit.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"
#include "common/check.h"

namespace pwm::collectives::algo {

namespace {

using Id = Schedule::Id;
constexpr Id kNone = Schedule::kNone;

struct Chunks {
  std::vector<size_t> off;  // n + 1 offsets, in elements
  size_t seg;
  size_t size(int c) const { return off[c + 1] - off[c]; }
  size_t nseg(int c) const { return size(c) == 0 ? 0 : (size(c) + seg - 1) / seg; }
  size_t seg_off(int c, size_t j) const { return j * seg; }
  size_t seg_len(int c, size_t j) const { return std::min(seg, size(c) - j * seg); }
  size_t max_nseg() const {
    size_t m = 0;
    for (size_t c = 0; c + 1 < off.size(); ++c) m = std::max(m, nseg(static_cast<int>(c)));
    return m;
  }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// last[c][j]: the last step that touched segment j of chunk c's destination.
using Tracker = std::vector<std::vector<Id>>;

Tracker make_tracker(const Chunks& ch, int n) {
  Tracker t(n);
  for (int c = 0; c < n; ++c) t[c].assign(ch.nseg(c), kNone);
  return t;
}

// Reduce-scatter around the ring. `own(c)` is this rank's contribution for chunk c; results for
// chunk c are written to dst[c]. Steps are tracked in `last`.
void ring_reduce_scatter(Schedule& s, int r, int n, const std::vector<const char*>& own,
                         const std::vector<char*>& dst, const Chunks& ch, Tracker& last) {
  if (n == 1) return;
  const size_t elem = s.elem();
  size_t slot_elems = 0;
  for (int c = 0; c < n; ++c) slot_elems = std::max(slot_elems, ch.size(c));
  const int nslots = n > 2 ? 2 : 1;
  char* tmp = static_cast<char*>(s.scratch(slot_elems * nslots));
  // tmp_last[slot][j]: the reduce that last read segment j of the slot.
  std::vector<std::vector<Id>> tmp_last(nslots, std::vector<Id>(ch.max_nseg(), kNone));
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int k = 0; k < n - 1; ++k) {
    const int cs = mod(r - k - 1, n);  // chunk sent
    const int cr = mod(r - k - 2, n);  // chunk received
    const int slot = k % nslots;
    const size_t segs = std::max(ch.nseg(cs), ch.nseg(cr));
    for (size_t j = 0; j < segs; ++j) {
      if (j < ch.nseg(cs)) {
        const char* src = (k == 0 ? own[cs] : dst[cs]) + ch.seg_off(cs, j) * elem;
        last[cs][j] = s.send(right, src, ch.seg_len(cs, j), {last[cs][j]});
      }
      if (j < ch.nseg(cr)) {
        char* t = tmp + (slot * slot_elems + ch.seg_off(cr, j)) * elem;
        Id rv = s.recv(left, t, ch.seg_len(cr, j), {tmp_last[slot][j]});
        const size_t o = ch.seg_off(cr, j) * elem;
        Id red = s.reduce(dst[cr] + o, own[cr] + o, t, ch.seg_len(cr, j), {rv, last[cr][j]});
        last[cr][j] = red;
        tmp_last[slot][j] = red;
      }
    }
  }
}

// All-gather around the ring: rank r starts with chunk r in dst[r] (or in `first`, sent from
// there in step 0), and ends with every chunk in dst.
void ring_allgather(Schedule& s, int r, int n, const char* first, const std::vector<char*>& dst,
                    const Chunks& ch, Tracker& last) {
  const size_t elem = s.elem();
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int k = 0; k < n - 1; ++k) {
    const int cs = mod(r - k, n);
    const int cr = mod(r - k - 1, n);
    const size_t segs = std::max(ch.nseg(cs), ch.nseg(cr));
    for (size_t j = 0; j < segs; ++j) {
      if (j < ch.nseg(cs)) {
        const char* src = (k == 0 && first ? first : dst[cs]) + ch.seg_off(cs, j) * elem;
        last[cs][j] = s.send(right, src, ch.seg_len(cs, j), {last[cs][j]});
      }
      if (j < ch.nseg(cr))
        last[cr][j] = s.recv(left, dst[cr] + ch.seg_off(cr, j) * elem, ch.seg_len(cr, j), {last[cr][j]});
    }
  }
}

}  // namespace

void allreduce_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg) {
  allreduce_ring(s, r, n, send, recv, count, seg, count, 0);
}

void allreduce_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg, size_t total,
                    size_t offset) {
  PWM_CHECK(offset <= total && count <= total - offset, "ring allreduce: a window of {} elements at {} of {}", count,
            offset, total);
  const size_t elem = s.elem();
  if (n == 1) {
    s.copy(recv, send, count);
    return;
  }
  // The whole vector's chunk boundaries, clipped to the window and moved to its origin: an
  // element of chunk c travels the ring from c+1 to c as it does in the whole vector's AllReduce.
  // Empty chunks are skipped alike on both sides of every pair.
  Chunks ch{std::vector<size_t>(n + 1), std::max<size_t>(seg, 1)};
  for (int i = 0; i <= n; ++i) ch.off[i] = std::clamp(split_offset(total, n, i), offset, offset + count) - offset;
  std::vector<const char*> own(n);
  std::vector<char*> dst(n);
  for (int c = 0; c < n; ++c) {
    own[c] = static_cast<const char*>(send) + ch.off[c] * elem;
    dst[c] = static_cast<char*>(recv) + ch.off[c] * elem;
  }
  Tracker last = make_tracker(ch, n);
  ring_reduce_scatter(s, r, n, own, dst, ch, last);
  ring_allgather(s, r, n, nullptr, dst, ch, last);
}

void reduce_scatter_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count,
                         size_t seg) {
  const size_t elem = s.elem();
  if (n == 1) {
    s.copy(recv, send, count);
    return;
  }
  Chunks ch{std::vector<size_t>(n + 1), std::max<size_t>(seg, 1)};
  for (int i = 0; i <= n; ++i) ch.off[i] = count * i;
  // Chunks passing through this rank are reduced into scratch; only chunk r lands in recv.
  char* work = static_cast<char*>(s.scratch(count * n));
  std::vector<const char*> own(n);
  std::vector<char*> dst(n);
  for (int c = 0; c < n; ++c) {
    own[c] = static_cast<const char*>(send) + ch.off[c] * elem;
    dst[c] = c == r ? static_cast<char*>(recv) : work + ch.off[c] * elem;
  }
  Tracker last = make_tracker(ch, n);
  ring_reduce_scatter(s, r, n, own, dst, ch, last);
}

void allgather_ring(Schedule& s, int r, int n, const void* send, void* recv, size_t count, size_t seg) {
  const size_t elem = s.elem();
  Chunks ch{std::vector<size_t>(n + 1), std::max<size_t>(seg, 1)};
  for (int i = 0; i <= n; ++i) ch.off[i] = count * i;
  std::vector<char*> dst(n);
  for (int c = 0; c < n; ++c) dst[c] = static_cast<char*>(recv) + ch.off[c] * elem;
  Tracker last = make_tracker(ch, n);
  // Own block: copied into place (a no-op when in place), and sent from `send` meanwhile.
  Id cp = s.copy(dst[r], send, count);
  for (auto& id : last[r]) id = cp;
  if (n > 1) ring_allgather(s, r, n, static_cast<const char*>(send), dst, ch, last);
}

}  // namespace pwm::collectives::algo
