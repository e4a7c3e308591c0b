#include "tests/collectives/conformance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "common/time.h"
#include "tests/collectives/reference.h"

namespace pwm::collectives::testing {

namespace {

constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kInt64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};

std::vector<Algorithm> algorithms(const ConformanceOptions& o) {
  std::vector<Algorithm> a = {Algorithm::kRing, Algorithm::kHalvingDoubling,
                              Algorithm::kRecursiveDoubling, Algorithm::kAuto};
  if (o.with_mpi) a.push_back(Algorithm::kMpi);
  return a;
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// True when every member passed the same value (checked with MPI's or our recursive doubling
// max and min of the value: equal iff all equal).
bool same_on_all(Communicator& comm, uint64_t v, Algorithm check_algo) {
  int64_t mx = static_cast<int64_t>(v >> 1), mn = mx;
  comm.allreduce(&mx, &mx, 1, DataType::kInt64, ReduceOp::kMax, check_algo);
  comm.allreduce(&mn, &mn, 1, DataType::kInt64, ReduceOp::kMin, check_algo);
  return mx == mn;
}

}  // namespace

std::vector<std::string> check_allreduce(Communicator& comm, const ConformanceOptions& o) {
  std::vector<std::string> fails;
  const int n = comm.size(), r = comm.rank();
  for (Algorithm algo : algorithms(o))
    for (DataType t : kTypes)
      for (ReduceOp op : kOps)
        for (size_t count : o.counts)
          for (bool in_place : {false, true}) {
            auto in = make_buffer(t, count, [&](size_t i) { return input_value(r, i); });
            auto out = in_place ? in : make_buffer(t, count, [](size_t) { return -7; });
            auto in_copy = in;
            comm.allreduce(in_place ? out.data() : in.data(), out.data(), count, t, op, algo);
            size_t wrong = count_wrong(t, out, count, [&](size_t i) { return expected_value(op, n, i); });
            if (wrong)
              fails.push_back(fmt::format("allreduce {} {} {} count={} {}: {} wrong elements on rank {}",
                                          algorithm_name(algo), dtype_name(t), reduce_op_name(op), count,
                                          in_place ? "in-place" : "out-of-place", wrong, r));
            if (!in_place && std::memcmp(in.data(), in_copy.data(), in.size()) != 0)
              fails.push_back(fmt::format("allreduce {} {} count={} modified its send buffer",
                                          algorithm_name(algo), dtype_name(t), count));
          }

  // Random floats: bitwise identical on every rank and across repeated runs; close to MPI.
  const Algorithm check_algo = o.with_mpi ? Algorithm::kMpi : Algorithm::kRecursiveDoubling;
  for (size_t count : o.counts) {
    std::vector<float> in(count + 1);
    std::mt19937 gen(1000 + r);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (auto& x : in) x = dist(gen);
    std::vector<float> ref(count + 1);
    if (o.with_mpi) comm.allreduce(in.data(), ref.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kMpi);
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling}) {
      std::vector<float> a(count + 1), b(count + 1);
      comm.allreduce(in.data(), a.data(), count, DataType::kFloat32, ReduceOp::kSum, algo);
      comm.allreduce(in.data(), b.data(), count, DataType::kFloat32, ReduceOp::kSum, algo);
      const uint64_t h = fnv1a(a.data(), count * 4);
      if (h != fnv1a(b.data(), count * 4))
        fails.push_back(fmt::format("allreduce {} count={}: two runs differ on rank {}", algorithm_name(algo), count, r));
      if (!same_on_all(comm, h, check_algo))
        fails.push_back(fmt::format("allreduce {} count={}: ranks hold different bits", algorithm_name(algo), count));
      if (o.with_mpi) {
        // |error| of a sum of n terms in [-1,1] in float: <= (n-1) * eps * sum|x| <= n^2 * 6e-8.
        const double tol = 1e-6 * n * n;
        for (size_t i = 0; i < count; ++i)
          if (std::fabs(a[i] - ref[i]) > tol) {
            fails.push_back(fmt::format("allreduce {} count={}: element {} is {} but MPI_Allreduce gives {}",
                                        algorithm_name(algo), count, i, a[i], ref[i]));
            break;
          }
      }
    }
  }
  return fails;
}

std::vector<std::string> check_other_collectives(Communicator& comm, const ConformanceOptions& o) {
  std::vector<std::string> fails;
  const int n = comm.size(), r = comm.rank();
  for (DataType t : kTypes)
    for (size_t count : o.counts) {
      for (ReduceOp op : kOps) {
        // ReduceScatter: block b of rank r's input is input_value(r, b * count + i).
        auto in = make_buffer(t, count * n, [&](size_t i) { return input_value(r, i); });
        auto out = make_buffer(t, count, [](size_t) { return -7; });
        comm.reduce_scatter(in.data(), out.data(), count, t, op);
        size_t wrong = count_wrong(t, out, count, [&](size_t i) { return expected_value(op, n, r * count + i); });
        if (wrong)
          fails.push_back(fmt::format("reduce_scatter {} {} count={}: {} wrong on rank {}", dtype_name(t),
                                      reduce_op_name(op), count, wrong, r));
        // Reduce to every root.
        for (int root = 0; root < n; ++root) {
          auto rin = make_buffer(t, count, [&](size_t i) { return input_value(r, i); });
          auto rout = make_buffer(t, count, [](size_t) { return -7; });
          comm.reduce(rin.data(), r == root ? rout.data() : nullptr, count, t, op, root);
          if (r == root) {
            size_t w = count_wrong(t, rout, count, [&](size_t i) { return expected_value(op, n, i); });
            if (w)
              fails.push_back(fmt::format("reduce {} {} count={} root={}: {} wrong", dtype_name(t),
                                          reduce_op_name(op), count, root, w));
          }
        }
      }
      // AllGather: block b holds rank b's values; in place too (send = block r of recv).
      for (bool in_place : {false, true}) {
        auto mine = make_buffer(t, count, [&](size_t i) { return input_value(r, i); });
        auto out = make_buffer(t, count * n, [](size_t) { return -7; });
        const void* send = mine.data();
        if (in_place) {
          std::memcpy(out.data() + r * count * dtype_size(t), mine.data(), count * dtype_size(t));
          send = out.data() + r * count * dtype_size(t);
        }
        comm.allgather(send, out.data(), count, t);
        size_t wrong = count_wrong(t, out, count * n, [&](size_t i) {
          return count ? input_value(static_cast<int>(i / count), i % count) : 0;
        });
        if (wrong)
          fails.push_back(fmt::format("allgather {} count={} {}: {} wrong on rank {}", dtype_name(t), count,
                                      in_place ? "in-place" : "out-of-place", wrong, r));
      }
      // Broadcast from every root.
      for (int root = 0; root < n; ++root) {
        auto buf = r == root ? make_buffer(t, count, [&](size_t i) { return input_value(root, i); })
                             : make_buffer(t, count, [](size_t) { return -7; });
        comm.broadcast(buf.data(), count, t, root);
        size_t wrong = count_wrong(t, buf, count, [&](size_t i) { return input_value(root, i); });
        if (wrong)
          fails.push_back(fmt::format("broadcast {} count={} root={}: {} wrong on rank {}", dtype_name(t),
                                      count, root, wrong, r));
      }
    }
  for (int i = 0; i < 3; ++i) comm.barrier();
  return fails;
}

std::vector<std::string> check_nonblocking(Communicator& comm) {
  std::vector<std::string> fails;
  const int n = comm.size(), r = comm.rank();
  const size_t count = 100003;
  std::vector<float> a(count), b(count);
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>(input_value(r, i));
    b[i] = static_cast<float>(-input_value(r, i));
  }
  Work wa = comm.iallreduce(a.data(), a.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
  Work wb = comm.iallreduce(b.data(), b.data(), count, DataType::kFloat32, ReduceOp::kMax,
                            Algorithm::kHalvingDoubling);
  bool da = false, db = false;
  while (!(da && db)) {
    if (!da) da = wa.test();
    if (!db) db = wb.test();
  }
  for (size_t i = 0; i < count; ++i) {
    if (a[i] != static_cast<float>(expected_value(ReduceOp::kSum, n, i)) ||
        b[i] != static_cast<float>(-expected_value(ReduceOp::kMin, n, i))) {
      fails.push_back(fmt::format("non-blocking allreduce: element {} wrong on rank {}", i, r));
      break;
    }
  }
  return fails;
}

std::vector<std::string> check_many_in_flight(const std::vector<Communicator*>& comms, int calls) {
  // Values that tell every call apart: {group rank, call, communicator}, summed over the group.
  std::vector<std::string> fails;
  const int64_t n = comms.front()->size(), r = comms.front()->rank();
  const size_t k = comms.size();
  std::vector<int64_t> buf(static_cast<size_t>(calls) * k * 3);
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(calls) * k);
  for (int i = 0; i < calls; ++i) {
    for (size_t c = 0; c < k; ++c) {
      int64_t* v = &buf[(i * k + c) * 3];
      v[0] = r;
      v[1] = i;
      v[2] = static_cast<int64_t>(c) * 1000 + i % 7;
      // Algorithms alternate so that calls in flight have different message patterns.
      const Algorithm a = (i + static_cast<int>(c)) % 2 ? Algorithm::kRing : Algorithm::kRecursiveDoubling;
      works.push_back(comms[c]->iallreduce(v, v, 3, DataType::kInt64, ReduceOp::kSum, a));
    }
  }
  // Completed newest first: the oldest calls were completed by the window, the rest now.
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  for (int i = 0; i < calls && fails.empty(); ++i) {
    for (size_t c = 0; c < k; ++c) {
      const int64_t* v = &buf[(i * k + c) * 3];
      const int64_t want[3] = {n * (n - 1) / 2, n * i, n * (static_cast<int64_t>(c) * 1000 + i % 7)};
      if (v[0] != want[0] || v[1] != want[1] || v[2] != want[2]) {
        fails.push_back(fmt::format("many in flight: call {} on communicator {} (context {}) got [{}, {}, {}], "
                                    "want [{}, {}, {}] on rank {}", i, c, comms[c]->context(), v[0], v[1], v[2],
                                    want[0], want[1], want[2], r));
        break;
      }
    }
  }
  return fails;
}

std::vector<std::string> check_abandoned_send_keeps_its_buffer(std::shared_ptr<Transport> t, Communicator& world) {
  std::vector<std::string> fails;
  const int w = t->rank();
  const size_t count = size_t{4} << 20;  // 16 MiB: 256 KiB segments, past every library's eager limit
  struct Buffers {
    std::vector<float> in, out;  // (not in place: the ring's sends read `in` itself, not a copy)
  };
  int64_t leave_at = 0;
  t->set_wait_hook([&] {
    if (leave_at > 0 && now_us() > leave_at) throw Interrupted("the test's hook");
  });
  auto run = [&](Buffers& b, double leave_after_s) {
    Communicator pair(t, {0, 1}, 1003);  // (a context no other test uses)
    leave_at = now_us() + static_cast<int64_t>(leave_after_s * 1e6);
    try {
      pair.allreduce(b.in.data(), b.out.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
      fails.push_back(fmt::format("rank {}: the AllReduce completed without its peer", w));
    } catch (const Interrupted&) {
    }
    leave_at = 0;
  };
  std::weak_ptr<Buffers> kept;
  world.barrier();
  if (w == 0) {
    auto b = std::make_shared<Buffers>(Buffers{std::vector<float>(count, 1.0f), std::vector<float>(count, 0.0f)});
    kept = b;
    {
      BufferOwnerScope scope(b);
      run(*b, 0.05);
    }
    b.reset();  // (the caller is done with them: only the transport may hold them now)
    if (kept.expired() || t->abandoned() == 0)
      fails.push_back("rank 0: the buffers of a send left posted were freed (or the send was not kept)");
  }
  world.barrier();
  Buffers mine;
  if (w == 1) {
    mine = {std::vector<float>(count, 2.0f), std::vector<float>(count, 0.0f)};
    run(mine, 2.0);  // (rank 0's messages arrive within the 2 s; then it waits for what rank 0 never sends)
  }
  world.barrier();
  if (w == 0) {
    const int64_t deadline = now_us() + 10'000'000;
    while (!kept.expired() && now_us() < deadline) {
      t->reap_abandoned();
      t->idle();
    }
    if (!kept.expired()) fails.push_back("rank 0: its buffers are still kept after rank 1 took every message sent");
  }
  world.barrier();  // (rank 0 progressed MPI in its loop above while rank 1 waited here)
  // Ring on 2 ranks, reduce-scatter: rank 0 sends chunk 1 (the second half), which rank 1 adds
  // to its own into its output.
  if (w == 1 && std::count(mine.out.begin() + count / 2, mine.out.end(), 3.0f) != static_cast<long>(count / 2))
    fails.push_back("rank 1: the half rank 0 sent before leaving did not arrive intact (1 + 2 = 3)");
  t->set_wait_hook({});
  world.barrier();
  return fails;
}

}  // namespace pwm::collectives::testing

namespace pwm::collectives::testing {

namespace {

std::vector<Algorithm> alltoall_algorithms(const ConformanceOptions& o, bool equal_counts) {
  std::vector<Algorithm> a = {Algorithm::kPairwise, Algorithm::kLinear, Algorithm::kAuto};
  if (equal_counts) a.push_back(Algorithm::kBruck);
  if (o.with_mpi) a.push_back(Algorithm::kMpi);
  return a;
}

// The reference: rank r's send buffer (blocks to ranks 0..n-1) and what it must receive (blocks
// from ranks 0..n-1), for the counts matrix c[from][to], by a plain loop.
struct Expected {
  std::vector<int64_t> send, recv;
  std::vector<size_t> send_counts, recv_counts;
};

Expected expected_alltoall(const std::vector<std::vector<size_t>>& c, int r) {
  Expected e;
  const int n = static_cast<int>(c.size());
  for (int p = 0; p < n; ++p) {
    e.send_counts.push_back(c[r][p]);
    e.recv_counts.push_back(c[p][r]);
    for (size_t i = 0; i < c[r][p]; ++i) e.send.push_back(alltoall_value(r, p, i));
    for (size_t i = 0; i < c[p][r]; ++i) e.recv.push_back(alltoall_value(p, r, i));
  }
  return e;
}

// One alltoall (counts all equal, `v` false) or alltoallv; returns this rank's output.
std::vector<std::byte> run_alltoall(Communicator& comm, const Expected& e, DataType t, Algorithm a, bool v,
                                    bool in_place, std::vector<std::string>& fails, const std::string& what) {
  const size_t ns = e.send.size(), nr = e.recv.size();
  auto send = make_buffer(t, ns, [&](size_t i) { return e.send[i]; });
  auto recv = make_buffer(t, std::max(ns, nr), [](size_t) { return -7; });
  if (in_place) std::memcpy(recv.data(), send.data(), ns * dtype_size(t));
  const void* src = in_place ? recv.data() : send.data();
  if (v)
    comm.alltoallv(src, e.send_counts, recv.data(), e.recv_counts, t, a);
  else
    comm.alltoall(src, recv.data(), e.send_counts[0], t, a);
  const size_t wrong = count_wrong(t, recv, nr, [&](size_t i) { return e.recv[i]; });
  if (wrong)
    fails.push_back(fmt::format("{} {} {} {}: {} wrong elements on rank {}", what, algorithm_name(a), dtype_name(t),
                                in_place ? "in-place" : "out-of-place", wrong, comm.rank()));
  recv.resize(nr * dtype_size(t));
  return recv;
}

// The alltoallv count matrices c[from][to] of the conformance matrix, by name.
std::vector<std::pair<std::string, std::vector<std::vector<size_t>>>> alltoallv_cases(int n) {
  using M = std::vector<std::vector<size_t>>;
  M zero(n, std::vector<size_t>(n, 0)), uneven = zero, edges, big = zero;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) {
      uneven[s][d] = (s + 2 * d) % 4 == 0 ? 0 : (s * 13 + d * 7) % 29 + 1;
      big[s][d] = 20000 + 997 * s + 331 * d;
    }
  edges = uneven;
  for (int i = 0; i < n; ++i) edges[0][i] = 0, edges[i][n - 1] = 0;  // rank 0 sends nothing, n-1 gets nothing
  return {{"zero", zero}, {"uneven", uneven}, {"sender0-receiver-last-empty", edges}, {"big", big}};
}

}  // namespace

std::vector<std::string> check_alltoall(Communicator& comm, const ConformanceOptions& o) {
  std::vector<std::string> fails;
  const int n = comm.size(), r = comm.rank();
  for (size_t count : o.alltoall_counts) {
    const Expected e = expected_alltoall(std::vector<std::vector<size_t>>(n, std::vector<size_t>(n, count)), r);
    for (DataType t : kTypes)
      for (bool in_place : {false, true}) {
        std::vector<std::byte> ours;
        for (Algorithm a : alltoall_algorithms(o, true)) {
          auto got = run_alltoall(comm, e, t, a, false, in_place, fails, fmt::format("alltoall count={}", count));
          if (a == Algorithm::kPairwise) ours = got;
          if (a == Algorithm::kMpi && got != ours)
            fails.push_back(fmt::format("alltoall count={} {}: MPI_Ialltoall's bits differ from pairwise's on rank {}",
                                        count, dtype_name(t), r));
        }
      }
  }
  for (const auto& [name, c] : alltoallv_cases(n)) {
    const Expected e = expected_alltoall(c, r);
    const std::vector<size_t> got_counts = comm.alltoall_counts(e.send_counts);
    if (got_counts != e.recv_counts)
      fails.push_back(fmt::format("alltoall_counts {}: wrong receive counts on rank {}", name, r));
    for (DataType t : {DataType::kFloat32, DataType::kInt64})
      for (bool in_place : {false, true}) {
        std::vector<std::byte> ours;
        for (Algorithm a : alltoall_algorithms(o, false)) {
          auto got = run_alltoall(comm, e, t, a, true, in_place, fails, "alltoallv " + name);
          if (a == Algorithm::kPairwise) ours = got;
          if (a == Algorithm::kMpi && got != ours)
            fails.push_back(fmt::format("alltoallv {} {}: MPI_Ialltoallv's bits differ from pairwise's on rank {}",
                                        name, dtype_name(t), r));
        }
      }
  }
  return fails;
}

std::vector<std::string> check_alltoall_nonblocking(Communicator& comm) {
  std::vector<std::string> fails;
  const int n = comm.size(), r = comm.rank();
  const size_t count = 10007;
  const Expected eq = expected_alltoall(std::vector<std::vector<size_t>>(n, std::vector<size_t>(n, count)), r);
  const Expected ev = expected_alltoall(alltoallv_cases(n)[1].second, r);
  std::vector<int64_t> a2a(eq.recv.size() + 1, -7), a2av(ev.recv.size() + 1, -7), sum(count);
  for (size_t i = 0; i < count; ++i) sum[i] = input_value(r, i);
  std::vector<Work> w;
  w.push_back(comm.ialltoall(eq.send.data(), a2a.data(), count, DataType::kInt64, Algorithm::kPairwise));
  w.push_back(comm.iallreduce(sum.data(), sum.data(), count, DataType::kInt64, ReduceOp::kSum, Algorithm::kRing));
  w.push_back(comm.ialltoallv(ev.send.data(), ev.send_counts, a2av.data(), ev.recv_counts, DataType::kInt64,
                              Algorithm::kLinear));
  for (size_t left = w.size(); left > 0;) {
    left = 0;
    for (auto& x : w) left += x.test() ? 0 : 1;
  }
  a2a.pop_back();
  a2av.pop_back();
  if (a2a != eq.recv) fails.push_back(fmt::format("non-blocking alltoall wrong on rank {}", r));
  if (a2av != ev.recv) fails.push_back(fmt::format("non-blocking alltoallv wrong on rank {}", r));
  for (size_t i = 0; i < count; ++i)
    if (sum[i] != expected_value(ReduceOp::kSum, n, i)) {
      fails.push_back(fmt::format("allreduce overlapped with alltoall: element {} wrong on rank {}", i, r));
      break;
    }
  return fails;
}

std::vector<std::string> check_interrupted_collective(std::shared_ptr<Transport> t, Communicator& world) {
  std::vector<std::string> fails;
  const int w = t->rank();
  const size_t count = 1000;  // (small messages: sent eagerly, they arrive whether or not posted)
  bool armed = false;
  int64_t armed_at = 0;
  t->set_wait_hook([&] {
    if (armed && now_us() - armed_at > 50'000) throw Interrupted("the test's hook");
  });
  // Rank `who` enters the pair's AllReduce alone and must leave it by the hook.
  auto leave_alone = [&](int who, std::vector<float>& buf) {
    if (w != who) return;
    Communicator pair(t, {0, 1}, 1001);  // (contexts no other test uses: stale messages stay unmatched)
    armed = true;
    armed_at = now_us();
    try {
      pair.allreduce(buf.data(), buf.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
      fails.push_back(fmt::format("rank {}: the AllReduce completed without its peer", w));
    } catch (const Interrupted&) {
    }
    armed = false;
  };
  std::vector<float> buf(count, 1.0f);
  world.barrier();
  leave_alone(0, buf);
  if (w == 0) std::fill(buf.begin(), buf.end(), 7.0f);  // (rank 0's again: nothing may write it now)
  world.barrier();
  leave_alone(1, buf);
  world.barrier();  // (rank 1's messages have been sent; rank 0 progresses MPI in these waits)
  world.barrier();
  if (w == 0 && std::count(buf.begin(), buf.end(), 7.0f) != static_cast<long>(count))
    fails.push_back("rank 0: its abandoned AllReduce's buffer was written after the collective was left");
  t->set_wait_hook({});
  if (w <= 1) {
    Communicator fresh(t, {0, 1}, 1002);
    std::vector<float> x(count, static_cast<float>(w + 1));
    fresh.allreduce(x.data(), x.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
    if (std::count(x.begin(), x.end(), 3.0f) != static_cast<long>(count))
      fails.push_back(fmt::format("rank {}: the AllReduce on a fresh context after the abandoned one is wrong", w));
  }
  world.barrier();
  return fails;
}

std::vector<std::string> check_context_drain(std::shared_ptr<Transport> t, Communicator& world, uint32_t context,
                                             size_t count) {
  std::vector<std::string> fails;
  const int w = t->rank(), n = t->size();
  int64_t leave_at = 0;
  t->set_wait_hook([&] {
    if (leave_at > 0 && now_us() > leave_at) throw Interrupted("the test's hook");
  });
  auto leave_alone = [&](int who) {
    world.barrier();
    if (w != who) return;
    Communicator pair(t, {0, 1}, context);
    // (owned by the transport once left: a posted send may still read it, Transport::abandon)
    auto xy = std::make_shared<std::vector<float>>(2 * count, 1.0f);
    BufferOwnerScope scope(xy);
    leave_at = now_us() + 50'000;
    try {
      pair.allreduce(xy->data(), xy->data() + count, count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
      fails.push_back(fmt::format("rank {}: the AllReduce completed without its peer", w));
    } catch (const Interrupted&) {
    }
    leave_at = 0;
  };
  leave_alone(0);
  leave_alone(1);
  t->set_wait_hook({});
  world.barrier();
  // Every rank's sent counts, row by row: sent[i * n + j] = messages of the context i sent to j.
  std::vector<int64_t> sent(static_cast<size_t>(n) * n, 0);
  const Transport::Traffic mine = t->traffic(context);
  for (int j = 0; j < n && !mine.sent.empty(); ++j) sent[static_cast<size_t>(w) * n + j] = mine.sent[j];
  world.allreduce(sent.data(), sent.data(), sent.size(), DataType::kInt64, ReduceOp::kSum);
  std::map<int, uint64_t> left;
  for (int i = 0; i < n; ++i) {
    const uint64_t got = mine.received.empty() ? 0 : mine.received[i];
    const auto to_me = static_cast<uint64_t>(sent[static_cast<size_t>(i) * n + w]);
    if (to_me < got) fails.push_back(fmt::format("rank {}: received {} messages from rank {}, which sent {}", w, got, i, to_me));
    if (to_me > got) left[i] = to_me - got;
  }
  if (w == 0 && left.empty()) fails.push_back("rank 0: nothing of rank 1 was left to drain (the case tests nothing)");
  ContextDrain drain(t, context, left);
  const int64_t deadline = now_us() + 10'000'000;
  while (!drain.progress() && now_us() < deadline) t->idle();
  if (drain.left() > 0) fails.push_back(fmt::format("rank {}: {} messages of the context never arrived", w, drain.left()));
  world.barrier();  // (a drained message can match no receive now, whenever its bytes come in)
  if (w <= 1) {
    Communicator fresh(t, {0, 1}, context);  // the same context, handed out again
    std::vector<float> x(count, static_cast<float>(w + 1));
    fresh.allreduce(x.data(), x.data(), count, DataType::kFloat32, ReduceOp::kSum, Algorithm::kRing);
    if (std::count(x.begin(), x.end(), 3.0f) != static_cast<long>(count))
      fails.push_back(fmt::format("rank {}: the AllReduce on the drained context is wrong", w));
  }
  world.barrier();
  return fails;
}

}  // namespace pwm::collectives::testing
