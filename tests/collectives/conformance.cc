#include "tests/collectives/conformance.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>

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

}  // namespace pwm::collectives::testing
