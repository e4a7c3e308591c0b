// collectives_bench: nccl-tests for this library. One harness owns the size sweep, warm-up,
// timing and checking; every row is measured in the same run as MPI's own MPI_Allreduce
// (algorithm "mpi") so that ratios, not absolute numbers, are what to read.
//
//   mpirun -n 2 collectives_bench -b 8 -e 64M -f 2 --algo ring,hd,rd,auto,mpi
//
// Columns as nccl-tests: size count type redop algo time(us) algbw busbw #wrong, where time is
// the slowest rank's average over -n iterations, algbw = size / time and busbw = algbw times
// 2(n-1)/n (AllReduce), (n-1)/n (AllGather, ReduceScatter) or 1 (Broadcast, Reduce).
//
// --inflight K (AllReduce): each iteration starts K AllReduces of the row's size at once on K
// buffers and waits for all, as a trainer's gradient buckets overlap on the wire; time is the
// iteration's over K (per AllReduce), so algbw is what the K together move. (Over the emulated
// 200 Mbit/s DCN, 4 or 16 in flight moved no more than one at a time: docs/simulator.md, "The
// shaped DCN".)
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "common/check.h"
#include "common/time.h"
#include "tests/collectives/reference.h"

using namespace pwm;
using namespace pwm::collectives;
using pwm::collectives::testing::expected_value;
using pwm::collectives::testing::input_value;

namespace {

size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suf = end ? end : "";
  double mult = 1;
  if (suf == "K" || suf == "k") mult = 1 << 10;
  else if (suf == "M" || suf == "m") mult = 1 << 20;
  else if (suf == "G" || suf == "g") mult = 1 << 30;
  else if (!suf.empty()) PWM_THROW("bad size '{}': use a number with an optional K, M or G suffix", s);
  if (end == s.c_str() || v < 0) PWM_THROW("bad size '{}'", s);
  return static_cast<size_t>(v * mult);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

struct Row {
  std::string op, algo;
  DataType dtype;
  ReduceOp redop;
  size_t bytes, count;
  double time_us, algbw, busbw;
  size_t wrong;
};

struct Bench {
  Communicator& comm;
  std::string op;
  DataType t;
  ReduceOp redop;
  bool in_place;
  int root = 0;

  // Elements each rank contributes / receives for a row of `bytes` total size (nccl-tests'
  // convention: size is the whole vector for AllReduce/Broadcast/Reduce, the gathered or
  // scattered total for AllGather/ReduceScatter).
  size_t count_for(size_t bytes) const {
    size_t c = bytes / dtype_size(t);
    if (op == "allgather" || op == "reduce_scatter") c /= comm.size();
    return c;
  }
  double bus_factor() const {
    const double n = comm.size();
    if (op == "allreduce") return 2 * (n - 1) / n;
    if (op == "allgather" || op == "reduce_scatter") return (n - 1) / n;
    return 1.0;
  }

  // K AllReduces in flight at once, out of place from one send buffer into K receive buffers.
  void run_inflight(Algorithm a, const std::vector<std::byte>& send, std::vector<std::vector<std::byte>>& recvs,
                    size_t count) {
    std::vector<Work> w;
    w.reserve(recvs.size());
    for (auto& r : recvs) w.push_back(comm.iallreduce(send.data(), r.data(), count, t, redop, a));
    // A Work progresses only inside its own test() or wait(): test every one in turn, as
    // BucketedAllreduce::poll does, or the K would run one after the other.
    for (size_t left = w.size(); left > 0;) {
      left = 0;
      for (auto& x : w) left += x.test() ? 0 : 1;
    }
  }

  // One call; send/recv sized by the caller.
  void run(Algorithm a, std::vector<std::byte>& send, std::vector<std::byte>& recv, size_t count) {
    void* s = send.data();
    void* r = in_place ? s : recv.data();
    if (op == "allreduce") comm.allreduce(s, r, count, t, redop, a);
    else if (op == "reduce_scatter") comm.reduce_scatter(s, recv.data(), count, t, redop);
    else if (op == "allgather") comm.allgather(s, recv.data(), count, t);
    else if (op == "broadcast") comm.broadcast(s, count, t, root);
    else if (op == "reduce") comm.reduce(s, recv.data(), count, t, redop, root);
  }

  void fill(std::vector<std::byte>& send, std::vector<std::byte>& recv, size_t count) {
    const int r = comm.rank(), n = comm.size();
    size_t send_n = op == "reduce_scatter" ? count * n : count;
    size_t recv_n = op == "allgather" ? count * n : count;
    if (op == "broadcast")
      send = testing::make_buffer(t, send_n, [&](size_t i) { return r == root ? input_value(root, i) : -7; });
    else
      send = testing::make_buffer(t, send_n, [&](size_t i) { return input_value(r, i); });
    recv = testing::make_buffer(t, recv_n, [](size_t) { return -7; });
  }

  size_t check(std::vector<std::byte>& send, std::vector<std::byte>& recv, size_t count) {
    const int r = comm.rank(), n = comm.size();
    if (op == "allreduce")
      return testing::count_wrong(t, in_place ? send : recv, count, [&](size_t i) { return expected_value(redop, n, i); });
    if (op == "reduce_scatter")
      return testing::count_wrong(t, recv, count, [&](size_t i) { return expected_value(redop, n, r * count + i); });
    if (op == "allgather")
      return testing::count_wrong(t, recv, count * n, [&](size_t i) { return input_value(static_cast<int>(i / count), i % count); });
    if (op == "broadcast")
      return testing::count_wrong(t, send, count, [&](size_t i) { return input_value(root, i); });
    if (op == "reduce" && r == root)
      return testing::count_wrong(t, recv, count, [&](size_t i) { return expected_value(redop, n, i); });
    return 0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  CLI::App app{"collectives_bench: nccl-tests-style sweep of the pathways-mpi collectives against MPI"};
  std::string min_s = "8", max_s = "64M", op = "allreduce", algos_s = "ring,hd,rd,auto,mpi",
              dtype_s = "float", redop_s = "sum", json_path;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, inflight = 1;
  bool in_place = false;
  double timeout = 300;
  app.add_option("-b,--minbytes", min_s, "smallest size (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size multiplier between rows")->capture_default_str()->check(CLI::Range(1.01, 1e6));
  app.add_option("-n,--iters", iters, "timed iterations per row")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations per row")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", check, "check every row's result (0/1)")->capture_default_str();
  app.add_option("--op", op, "allreduce|reduce_scatter|allgather|broadcast|reduce")->capture_default_str()
      ->check(CLI::IsMember({"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"}));
  app.add_option("--algo", algos_s, "comma list of ring,hd,rd,auto,mpi (AllReduce; other ops use their one algorithm)")->capture_default_str();
  app.add_option("-d,--datatype", dtype_s, "float|double|int32|int64")->capture_default_str();
  app.add_option("-o,--op_type", redop_s, "sum|max|min")->capture_default_str();
  app.add_flag("--inplace", in_place, "in-place operation (default out of place)");
  app.add_option("--inflight", inflight, "AllReduces in flight at once per iteration (time per AllReduce)")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--json", json_path, "also write the rows as JSON to this file");
  app.add_option("--coll-timeout", timeout, "collective watchdog timeout in seconds")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = env.rank() == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 1 : 0);
    return rc;
  }

  return run_mpi_main(env, [&]() -> int {
    CommOptions opts = CommOptions::from_env();
    opts.timeout_s = timeout;
    Communicator comm = Communicator::world(env.transport(), opts);
    Bench b{comm, op, parse_dtype(dtype_s), parse_reduce_op(redop_s), in_place};
    std::vector<Algorithm> algos;
    if (op == "allreduce") {
      for (auto& a : split(algos_s)) algos.push_back(parse_algorithm(a));
    } else {
      algos.push_back(Algorithm::kAuto);  // the op's own algorithm
    }
    if (inflight > 1 && (op != "allreduce" || in_place))
      PWM_THROW("--inflight {} needs --op allreduce out of place (got --op {}{})", inflight, op, in_place ? " --inplace" : "");
    const size_t minb = parse_size(min_s), maxb = parse_size(max_s);
    if (minb > maxb) PWM_THROW("-b {} is larger than -e {}", min_s, max_s);
    if (!json_path.empty() && env.rank() == 0) {  // fail before the sweep, not after
      std::ofstream probe(json_path + ".tmp");
      if (!probe) PWM_THROW("cannot write --json {}: check the directory exists and is writable", json_path);
    }
    const bool root_prints = env.rank() == 0;
    auto op_algo_name = [&](Algorithm a) -> std::string {
      if (op == "allreduce") return algorithm_name(a);
      if (op == "broadcast" || op == "reduce") return "tree";
      return "ring";
    };
    if (root_prints) {
      fmt::print("# collectives_bench: {} ranks, op {}, {} {}, {}, iters {} warmup {}, segment {} B, in flight {}\n",
                 comm.size(), op, dtype_name(b.t), reduce_op_name(b.redop), in_place ? "in-place" : "out-of-place",
                 iters, warmup, opts.segment_bytes, inflight);
      fmt::print("#\n# {:>12} {:>12} {:>8} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7} {:>7}\n", "size", "count",
                 "type", "redop", "algo", "time(us)", "algbw", "busbw", "#wrong", "vs_mpi");
      fmt::print("# {:>12} {:>12} {:>8} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7} {:>7}\n", "(B)", "(elements)", "",
                 "", "", "", "(GB/s)", "(GB/s)", "", "(busbw)");
    }
    std::vector<Row> rows;
    size_t total_wrong = 0;
    for (double sz = static_cast<double>(minb); sz <= static_cast<double>(maxb) * 1.0000001; sz *= factor) {
      const size_t count = b.count_for(static_cast<size_t>(sz));
      const size_t bytes = count * dtype_size(b.t) * ((op == "allgather" || op == "reduce_scatter") ? comm.size() : 1);
      std::vector<std::byte> send, recv;
      b.fill(send, recv, count);
      std::vector<std::vector<std::byte>> recvs(inflight > 1 ? inflight : 0, recv);
      auto once = [&](Algorithm a) {
        if (inflight > 1) b.run_inflight(a, send, recvs, count);
        else b.run(a, send, recv, count);
      };
      std::map<Algorithm, double> busbw_of;
      for (Algorithm a : algos) {
        for (int i = 0; i < warmup; ++i) once(a);
        comm.barrier();
        const double t0 = now_s();
        for (int i = 0; i < iters; ++i) once(a);
        double t_us = (now_s() - t0) * 1e6 / iters / inflight;
        comm.allreduce(&t_us, &t_us, 1, DataType::kFloat64, ReduceOp::kMax, Algorithm::kMpi);  // slowest rank
        int64_t wrong = 0;
        if (check && inflight > 1) {  // every buffer of the last timed iteration
          for (auto& r : recvs) wrong += static_cast<int64_t>(b.check(send, r, count));
          for (auto& r : recvs) r = recv;
        }
        if (check) {
          b.fill(send, recv, count);
          b.run(a, send, recv, count);
          wrong += static_cast<int64_t>(b.check(send, recv, count));
          comm.allreduce(&wrong, &wrong, 1, DataType::kInt64, ReduceOp::kSum, Algorithm::kMpi);
          b.fill(send, recv, count);
        }
        total_wrong += static_cast<size_t>(wrong);
        const double algbw = t_us > 0 ? bytes / t_us * 1e-3 : 0;  // GB/s
        busbw_of[a] = algbw * b.bus_factor();
        rows.push_back({op, op_algo_name(a), b.t, b.redop, bytes, count, t_us, algbw, busbw_of[a],
                        static_cast<size_t>(wrong)});
      }
      // Print the size's rows once all are measured, with each one's ratio to MPI's.
      for (size_t k = rows.size() - algos.size(); k < rows.size() && root_prints; ++k) {
        const Row& r = rows[k];
        const Algorithm a = algos[k - (rows.size() - algos.size())];
        const bool have_mpi = busbw_of.count(Algorithm::kMpi) && busbw_of[Algorithm::kMpi] > 0;
        std::string vs = have_mpi && a != Algorithm::kMpi ? fmt::format("{:.2f}x", r.busbw / busbw_of[Algorithm::kMpi]) : "";
        fmt::print("  {:>12} {:>12} {:>8} {:>6} {:>5} {:>10.2f} {:>8.3f} {:>8.3f} {:>7} {:>7}\n", r.bytes, r.count,
                   dtype_name(r.dtype), reduce_op_name(r.redop), r.algo, r.time_us, r.algbw, r.busbw, r.wrong, vs);
        std::fflush(stdout);
      }
      if (count == 0 && sz == 0) break;
    }
    if (root_prints) {
      fmt::print("#\n# Avg bus bandwidth per algorithm (GB/s):");
      for (Algorithm a : algos) {
        double sum = 0;
        int k = 0;
        for (auto& r : rows)
          if (r.algo == op_algo_name(a)) sum += r.busbw, ++k;
        fmt::print(" {} {:.3f}", op_algo_name(a), k ? sum / k : 0.0);
      }
      fmt::print("\n");
      // The acceptance ratios of issue 2, when the sweep covers them and includes mpi.
      auto ratio = [&](const std::string& algo, size_t lo, size_t hi, bool use_time) {
        double prod = 1;
        int k = 0;
        for (auto& r : rows) {
          if (r.algo != algo || r.bytes < lo || r.bytes > hi) continue;
          for (auto& m : rows)
            if (m.algo == "mpi" && m.bytes == r.bytes && m.time_us > 0 && r.time_us > 0) {
              prod *= use_time ? r.time_us / m.time_us : r.busbw / m.busbw;
              ++k;
            }
        }
        return k ? std::pow(prod, 1.0 / k) : 0.0;
      };
      if (op == "allreduce" && std::find(algos.begin(), algos.end(), Algorithm::kMpi) != algos.end()) {
        for (Algorithm a : algos) {
          if (a == Algorithm::kMpi) continue;
          double big = ratio(algorithm_name(a), 4u << 20, 64u << 20, false);
          double small = ratio(algorithm_name(a), 4, 4096, true);
          fmt::print("# {:>4}: busbw / MPI_Allreduce's, 4 MiB-64 MiB (geomean): {}   time / MPI_Allreduce's, 4 B-4 KiB (geomean): {}\n",
                     algorithm_name(a), big > 0 ? fmt::format("{:.2f}x", big) : "n/a",
                     small > 0 ? fmt::format("{:.2f}x", small) : "n/a");
        }
      }
      fmt::print("# Out of bounds values : {} {}\n", total_wrong, total_wrong ? "FAILED" : "OK");
    }
    if (!json_path.empty() && root_prints) {
      nlohmann::json j;
      j["ranks"] = comm.size();
      j["inflight"] = inflight;
      j["rows"] = nlohmann::json::array();
      for (auto& r : rows)
        j["rows"].push_back({{"op", r.op}, {"algo", r.algo}, {"dtype", dtype_name(r.dtype)}, {"bytes", r.bytes},
                             {"time_us", r.time_us}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw}, {"wrong", r.wrong}});
      {
        std::ofstream f(json_path + ".tmp");
        f << j.dump(1) << "\n";
        if (!f) PWM_THROW("writing {} failed", json_path);
      }
      if (std::rename((json_path + ".tmp").c_str(), json_path.c_str()) != 0)
        PWM_THROW("cannot rename {}.tmp to {}", json_path, json_path);
    }
    if (total_wrong) PWM_THROW("{} wrong elements", total_wrong);
    return 0;
  });
}
