// AllToAll algorithms: pairwise exchange, linear, Bruck.
//
// Pairwise exchange. Step k (1 <= k < n): rank r sends its block for r+k and receives the block
// of r-k; every rank talks to one peer each way per step, so no link or receiver is flooded
// (MPICH's and OpenMPI's choice for large blocks). A step waits for the previous step's send and
// receive, as MPI_Sendrecv would. Between two ranks a and b = a+k there is one message each way,
// in step k for a -> b and step n-k for b -> a, so the pair's order is trivially the same on both
// sides. The own block is a local copy with no dependency: it overlaps step 1.
//
// Linear. The same messages with no dependencies: the executor posts all of them at once and
// the MPI library (or the fabric) orders them. Fewer round trips than pairwise, more messages in
// flight at each receiver.
//
// Bruck (equal counts). Index the blocks relative to the rank: logical block i of rank r is its
// block for rank (r+i) mod n (the "local rotation"). Step k (d = 2^k) sends to r+d every logical
// block whose index has bit k set, and receives from r-d the same indices of that rank; after
// the ceil(log2 n) steps logical block i holds the data of rank r-i for r. A block moves at most
// log2 n times, so a message carries ~n/2 blocks: log n messages instead of n-1, for ~log2(n)/2
// times the bytes. The blocks of a step are not contiguous: they are packed into one message
// with copies (a lone block is sent from where it lives); received blocks are not unpacked but used where they arrived (each logical block
// is tracked by where it lives and the step that put it there), and the final inverse rotation
// copies each into its place in recv. Between a and b = a + 2^k there is at most one message
// (the 2^k are distinct and < n), so pairs match trivially here too.
//
// Zero-element blocks are skipped; both sides of a pair see the same count (the caller's
// contract: rank a's send_counts[b] == rank b's recv_counts[a]), so they skip the same message.
#include <numeric>
#include <vector>

#include "collectives/algorithms.h"

namespace pwm::collectives::algo {

namespace {

using Id = Schedule::Id;
constexpr Id kNone = Schedule::kNone;

int mod(int a, int n) { return ((a % n) + n) % n; }

// Offsets (in elements) of blocks packed in rank order.
std::vector<size_t> offsets(std::span<const size_t> counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  return off;
}

// Where the send blocks are read from: the send buffer, or in place a scratch copy of it (the
// receives overwrite blocks not yet sent); `ready` is the copy, kNone out of place. Every write
// into recv waits for it.
struct Source {
  const char* data;
  Id ready;
};

Source source(Schedule& s, const void* send, void* recv, size_t total) {
  if (send != recv || total == 0) return {static_cast<const char*>(send), kNone};
  void* tmp = s.scratch(total);
  return {static_cast<const char*>(tmp), s.copy(tmp, send, total)};
}

// The pairwise messages; each step after the previous one (`in_steps`) or all at once.
void exchange(Schedule& s, int r, int n, const void* send, std::span<const size_t> sc, void* recv,
              std::span<const size_t> rc, bool in_steps) {
  const size_t elem = s.elem();
  const std::vector<size_t> so = offsets(sc), ro = offsets(rc);
  const Source src = source(s, send, recv, so[n]);
  char* out = static_cast<char*>(recv);
  Schedule::Deps prev = {src.ready};
  for (int k = 1; k < n; ++k) {
    const int to = mod(r + k, n), from = mod(r - k, n);
    const Id sd = sc[to] ? s.send(to, src.data + so[to] * elem, sc[to], prev) : kNone;
    const Id rv = rc[from] ? s.recv(from, out + ro[from] * elem, rc[from], prev) : kNone;
    if (in_steps && (sd != kNone || rv != kNone)) prev = {sd, rv, src.ready};
  }
  // The own block last in the schedule: the first step's messages are posted before the copy
  // runs, so the copy overlaps their transfer instead of delaying it.
  if (sc[r] > 0) s.copy(out + ro[r] * elem, src.data + so[r] * elem, sc[r], {src.ready});
}

}  // namespace

void alltoallv_pairwise(Schedule& s, int r, int n, const void* send, std::span<const size_t> send_counts,
                        void* recv, std::span<const size_t> recv_counts) {
  exchange(s, r, n, send, send_counts, recv, recv_counts, /*in_steps=*/true);
}

void alltoallv_linear(Schedule& s, int r, int n, const void* send, std::span<const size_t> send_counts,
                      void* recv, std::span<const size_t> recv_counts) {
  exchange(s, r, n, send, send_counts, recv, recv_counts, /*in_steps=*/false);
}

void alltoall_bruck(Schedule& s, int r, int n, const void* send, void* recv, size_t count) {
  if (count == 0) return;
  const size_t elem = s.elem(), block = count * elem;
  const Source src = source(s, send, recv, count * n);
  // Logical block i: where it lives now, and the step that put it there.
  std::vector<const char*> at(n);
  std::vector<Id> last(n, src.ready);
  for (int i = 0; i < n; ++i) at[i] = src.data + static_cast<size_t>(mod(r + i, n)) * block;
  for (int bit = 0; (1 << bit) < n; ++bit) {
    std::vector<int> moved;
    for (int i = 0; i < n; ++i)
      if ((i >> bit) & 1) moved.push_back(i);
    const size_t k = moved.size();
    // One block (groups of 2 and 3, and a step's last block) goes from where it lives, unpacked.
    const char* msg = at[moved[0]];
    Schedule::Deps packed = {last[moved[0]]};
    if (k > 1) {
      char* pack = static_cast<char*>(s.scratch(k * count));
      packed.clear();
      for (size_t j = 0; j < k; ++j) packed.push_back(s.copy(pack + j * block, at[moved[j]], count, {last[moved[j]]}));
      msg = pack;
    }
    char* got = static_cast<char*>(s.scratch(k * count));
    s.send(mod(r + (1 << bit), n), msg, k * count, packed);
    const Id rv = s.recv(mod(r - (1 << bit), n), got, k * count);
    for (size_t j = 0; j < k; ++j) {
      at[moved[j]] = got + j * block;
      last[moved[j]] = rv;
    }
  }
  // The inverse rotation: logical block i now holds what rank r-i sent to r.
  char* out = static_cast<char*>(recv);
  for (int i = 0; i < n; ++i) s.copy(out + static_cast<size_t>(mod(r - i, n)) * block, at[i], count, {last[i], src.ready});
}

}  // namespace pwm::collectives::algo
