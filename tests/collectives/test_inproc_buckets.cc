// BucketedAllreduce over the in-process transport: every element reduced once whatever the
// bucket size, gaps between units left alone, the hierarchical form; and a window of a vector
// reduced with the whole vector's bits, which is how a piece's parts get their buckets' bits.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <mutex>

#include "collectives/bucketed_allreduce.h"
#include "collectives/communicator.h"
#include "collectives/inproc_transport.h"
#include "tests/collectives/test_inproc.h"

namespace pwm::collectives {
namespace {

using testing::default_options;

TEST(BucketedAllreduce, EveryElementReducedOnceWhateverTheBucketSize) {
  // Units of uneven sizes tiling [0, 1000) from the end; buckets of 1..2000 elements; overlap on
  // and off. Every element must hold the sum over ranks exactly once.
  const std::vector<BucketedAllreduce::Range> units = {{900, 1000}, {500, 900}, {499, 500}, {0, 499}};
  for (size_t bucket_elems : {1u, 7u, 100u, 401u, 2000u})
    for (bool overlap : {true, false}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(3, [&](int rank, std::shared_ptr<Transport> t) {
        Communicator c = Communicator::world(t, CommOptions{});
        BucketedAllreduce br(&c, units, bucket_elems * sizeof(float), overlap);
        std::vector<float> buf(1000);
        for (int round = 0; round < 2; ++round) {
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((rank + 1) * (i % 5 + round));
          br.begin(buf.data());
          for (int u = 0; u < br.num_units(); ++u) br.unit_done(u);
          br.finish();
          for (size_t i = 0; i < buf.size(); ++i)
            if (buf[i] != static_cast<float>(6 * (i % 5 + round))) {
              std::lock_guard<std::mutex> lock(mu);
              fails.push_back(fmt::format("bucket {} overlap {} element {}: {}", bucket_elems, overlap, i, buf[i]));
              break;
            }
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

// Units with gaps between them (an expert-parallel trainer's dense gradient around the experts'
// ranges): every element of a unit is summed once, every element of a gap keeps its own value,
// flat and hierarchical, whatever the bucket size.
TEST(BucketedAllreduce, GapsBetweenUnitsAreLeftAlone) {
  const std::vector<BucketedAllreduce::Range> units = {{950, 1000}, {600, 900}, {590, 600}, {0, 400}};
  auto in_unit = [&](size_t i) {
    for (const auto& [lo, hi] : units)
      if (static_cast<int64_t>(i) >= lo && static_cast<int64_t>(i) < hi) return true;
    return false;
  };
  for (size_t bucket_elems : {7u, 100u, 2000u})
    for (bool hierarchical : {false, true}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(4, [&](int rank, std::shared_ptr<Transport> t) {
        CommOptions o = default_options();
        o.timeout_s = 8;
        Communicator flat = Communicator::world(t, o);
        Communicator inner(t, {rank / 2 * 2, rank / 2 * 2 + 1}, 5, o);
        Communicator gather(t, {rank / 2 * 2, rank / 2 * 2 + 1}, 7, o);
        Communicator outer(t, {rank % 2, 2 + rank % 2}, 6, o);
        std::unique_ptr<BucketedAllreduce> br =
            hierarchical ? std::make_unique<BucketedAllreduce>(&inner, &gather, &outer, units, bucket_elems * 4, true)
                         : std::make_unique<BucketedAllreduce>(&flat, units, bucket_elems * 4, true);
        std::vector<float> buf(1100);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>((rank + 1) * (i % 5 + 1));
        br->begin(buf.data());
        for (int u = 0; u < br->num_units(); ++u) br->unit_done(u);
        br->finish();
        for (size_t i = 0; i < buf.size(); ++i) {
          const float want = static_cast<float>((in_unit(i) ? 10 : rank + 1) * (i % 5 + 1));
          if (buf[i] != want) {
            std::lock_guard<std::mutex> lock(mu);
            fails.push_back(fmt::format("bucket {} hierarchical {} element {}: {} (want {})", bucket_elems,
                                        hierarchical, i, buf[i], want));
            break;
          }
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

TEST(BucketedAllreduce, HierarchicalSumsOverBothGroups) {
  // 6 ranks as 2 "replicas" x 3 (inner groups {0,1,2}, {3,4,5}; outer groups {0,3}, {1,4},
  // {2,5}): reduce-scatter inside, AllReduce of the shard across, all-gather inside. Buckets of
  // lengths not divisible by 3 (padding), overlap on and off. Every element must hold the sum over
  // all 6 ranks (small integers: exact in float, whatever the order), and equal the flat
  // AllReduce over all 6.
  const std::vector<BucketedAllreduce::Range> units = {{900, 1000}, {500, 900}, {499, 500}, {0, 499}};
  // (Buckets of 7 elements or more: at most 256 buckets, the hierarchical form's limit.)
  for (size_t bucket_elems : {7u, 100u, 401u, 2000u})
    for (bool overlap : {true, false}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(6, [&](int rank, std::shared_ptr<Transport> t) {
        const int rep = rank / 3, idx = rank % 3;
        CommOptions o = default_options();
        o.timeout_s = 8;
        Communicator inner(t, {rep * 3, rep * 3 + 1, rep * 3 + 2}, 5, o);
        Communicator gather(t, {rep * 3, rep * 3 + 1, rep * 3 + 2}, 7, o);
        Communicator outer(t, {idx, 3 + idx}, 6, o);
        Communicator flat = Communicator::world(t, o);
        BucketedAllreduce br(&inner, &gather, &outer, units, bucket_elems * sizeof(float), overlap);
        BucketedAllreduce fr(&flat, units, bucket_elems * sizeof(float), overlap);
        std::vector<float> buf(1000), ref(1000);
        for (int round = 0; round < 2; ++round) {
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = ref[i] = static_cast<float>((rank + 1) * (i % 5 + round));
          br.begin(buf.data());
          fr.begin(ref.data());
          for (int u = 0; u < br.num_units(); ++u) br.unit_done(u);
          br.finish();
          for (int u = 0; u < fr.num_units(); ++u) fr.unit_done(u);
          fr.finish();
          for (size_t i = 0; i < buf.size(); ++i)
            if (buf[i] != static_cast<float>(21 * (i % 5 + round)) || buf[i] != ref[i]) {
              std::lock_guard<std::mutex> lock(mu);
              fails.push_back(fmt::format("bucket {} overlap {} element {}: {} (flat {})", bucket_elems, overlap, i,
                                          buf[i], ref[i]));
              break;
            }
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

// Values whose sum depends on the order of the additions (magnitudes 2^-20..2^20, both signs):
// a window reduced in another order than the whole vector's shows in the low bits.
float order_sensitive(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>((rank + 1) * 40503u);
  return std::ldexp(static_cast<float>(h % 1000003u) / 1000003.0f - 0.5f, static_cast<int>(h % 41) - 20);
}

TEST(InProc, AllreduceWindowGivesTheWholeVectorsBits) {
  // Windows of a vector of `total` elements (empty, inside one ring chunk, across chunk
  // boundaries, the whole) reduced on their own: every element holds exactly the bits the
  // AllReduce of the whole vector gives it, for every algorithm and group size; and the same
  // window reduced as a vector of its own differs (the check has teeth: the ring's order moves).
  for (int n : {1, 2, 3, 4, 5}) {
    std::mutex mu;
    std::vector<std::string> fails;
    bool moved = false;
    run_inproc(n, [&](int rank, std::shared_ptr<Transport> t) {
      CommOptions o = default_options();
      o.segment_bytes = 64;  // several segments per chunk
      Communicator c = Communicator::world(t, o);
      for (const size_t total : {size_t{1}, size_t{10}, size_t{1001}}) {
        std::vector<float> in(total), whole(total);
        for (size_t i = 0; i < total; ++i) in[i] = order_sensitive(rank, i);
        const std::vector<std::pair<size_t, size_t>> windows = {
            {0, 0}, {0, total}, {0, total / 2}, {total / 3, total / 3 + 1}, {total / 5, total - total / 5},
            {total - 1, total}};
        for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling,
                            Algorithm::kAuto}) {
          c.allreduce(in.data(), whole.data(), total, DataType::kFloat32, ReduceOp::kSum, a);
          for (const auto& [lo, hi] : windows) {
            if (lo > hi || hi > total) continue;
            std::vector<float> part(hi - lo), alone(hi - lo);
            c.iallreduce_window(in.data() + lo, part.data(), hi - lo, DataType::kFloat32, ReduceOp::kSum,
                                Communicator::Window{total, lo}, a)
                .wait();
            c.allreduce(in.data() + lo, alone.data(), hi - lo, DataType::kFloat32, ReduceOp::kSum, a);
            std::lock_guard<std::mutex> lock(mu);
            for (size_t i = lo; i < hi; ++i) {
              if (part[i - lo] != whole[i]) {
                fails.push_back(fmt::format("n {} {} total {} window [{}, {}) element {}: {} (whole vector: {})", n,
                                            algorithm_name(a), total, lo, hi, i, part[i - lo], whole[i]));
                break;
              }
              if (alone[i - lo] != whole[i]) moved = true;
            }
          }
        }
      }
      // A proper window cannot be promised by MPI's own AllReduce; a bad window is one line.
      float x = 1;
      EXPECT_THROW(c.iallreduce_window(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, Communicator::Window{2, 0},
                                       Algorithm::kMpi),
                   Error);
      EXPECT_THROW(c.iallreduce_window(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, Communicator::Window{1, 1}),
                   Error);
    });
    EXPECT_TRUE(fails.empty()) << fails.size() << " failures, first: " << fails.front();
    if (n >= 3) {
      EXPECT_TRUE(moved) << "n " << n << ": no window reduced alone differed from the whole vector's bits";
    }
  }
}

TEST(BucketedAllreduce, PartsReducedAsWindowsGiveTheBucketsBits) {
  // The gradient buffer of a trainer reducing in buckets, and the same buffer stored as other
  // pieces (one of two distant ranges, as pathways_train's tied piece; the others across bucket
  // boundaries) whose parts are reduced as windows of the buckets: bitwise the buckets' result,
  // for groups of 2..5 and buckets of several sizes (auto: 1/4 of the buffer).
  const std::vector<BucketedAllreduce::Range> units = {{990, 1000}, {600, 990}, {200, 600}, {0, 200}};
  const std::vector<std::vector<BucketedAllreduce::Range>> pieces = {
      {{0, 200}, {990, 1000}}, {{200, 600}}, {{600, 990}}};
  for (int n : {2, 3, 4, 5})
    for (size_t bucket_bytes : {size_t{0}, size_t{1024}, size_t{1500}, size_t{8000}}) {
      std::mutex mu;
      std::vector<std::string> fails;
      run_inproc(n, [&](int rank, std::shared_ptr<Transport> t) {
        CommOptions o = default_options();
        o.segment_bytes = 256;
        Communicator c = Communicator::world(t, o);
        std::vector<float> buf(1000);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = order_sensitive(rank, i);
        const std::vector<float> in = buf;
        BucketedAllreduce br(&c, units, bucket_bytes, true);
        br.begin(buf.data());
        for (int u = 0; u < br.num_units(); ++u) br.unit_done(u);
        br.finish();
        const std::vector<BucketedAllreduce::Cut> cuts = BucketedAllreduce::cut(units, bucket_bytes);
        for (size_t p = 0; p < pieces.size(); ++p) {
          std::vector<float> store, out;
          for (const auto& [lo, hi] : pieces[p]) store.insert(store.end(), in.begin() + lo, in.begin() + hi);
          out.assign(store.size(), 0.0f);
          std::vector<Work> works;
          size_t covered = 0;
          for (const BucketedAllreduce::Part& q : BucketedAllreduce::parts(cuts, pieces[p])) {
            works.push_back(c.iallreduce_window(store.data() + q.at, out.data() + q.at, static_cast<size_t>(q.count),
                                                DataType::kFloat32, ReduceOp::kSum,
                                                Communicator::Window{static_cast<size_t>(q.bucket_elems),
                                                                     static_cast<size_t>(q.offset)}));
            covered += static_cast<size_t>(q.count);
          }
          for (Work& w : works) w.wait();
          size_t at = 0;
          std::lock_guard<std::mutex> lock(mu);
          if (covered != store.size())
            fails.push_back(fmt::format("piece {}: parts cover {} of {}", p, covered, store.size()));
          for (const auto& [lo, hi] : pieces[p])
            for (int64_t i = lo; i < hi; ++i, ++at)
              if (out[at] != buf[static_cast<size_t>(i)] && fails.size() < 5)
                fails.push_back(fmt::format("n {} bucket bytes {} piece {} element {}: {} (buckets: {})", n,
                                            bucket_bytes, p, i, out[at], buf[static_cast<size_t>(i)]));
        }
      });
      EXPECT_TRUE(fails.empty()) << fails.front();
    }
}

}  // namespace
}  // namespace pwm::collectives
