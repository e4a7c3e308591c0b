// collectives_bench: nccl-tests for this library. One harness owns the size sweep, warm-up,
// timing and checking; every row is measured in the same run as MPI's own MPI_Allreduce
// (algorithm "mpi") so that ratios, not absolute numbers, are what to read.
//
//   mpirun -n 2 collectives_bench -b 8 -e 64M -f 2 --algo ring,hd,rd,auto,mpi
//
// Columns as nccl-tests: size count type redop algo time(us) algbw busbw #wrong, where time is
// the slowest rank's average over -n iterations, algbw = size / time and busbw = algbw times
// 2(n-1)/n (AllReduce), (n-1)/n (AllGather, ReduceScatter) or 1 (Broadcast, Reduce).
// AllToAll (--op alltoall, algorithms pairwise,bruck,linear,auto,mpi): -b/-e are bytes per peer
// and so is the size column; algbw = n x size / time (what each rank's send buffer holds) and
// busbw = algbw x (n-1)/n (nccl-tests' convention: the bytes each rank puts on the wire).
//
// --inflight K (AllReduce): each iteration starts K AllReduces of the row's size at once on K
// buffers and waits for all, as a trainer's gradient buckets overlap on the wire; time is the
// iteration's over K (per AllReduce), so algbw is what the K together move. (Over the emulated
// 200 Mbit/s DCN, 4 or 16 in flight moved no more than one at a time:
// docs/simulator_calibration.md, "The shaped DCN").
//
// --rounds R: each size's algorithms are measured R times in alternating order (ABC CBA ...);
// a row's time is the median over rounds and vs_mpi the median of the rounds' MPI/ours time
// ratios with their range, "1.31x (1.12-1.45)". On a shared VM the position of an algorithm in a
// size's sequence moves its time (the first measured can be 3x faster at 64 KiB): one round
// ranks the algorithms by their order, not their speed.
//
// main parses the flags; run() resolves the modes into enums (resolve), sweeps the sizes (sweep:
// measure and check_row per algorithm, print_rows per size) and ends with print_summary and
// write_json. The columns, the footer and the JSON are read by mpi_scripts/ (sim_calibrate.sh)
// and tests/collectives: keep their format.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_transport.h"
#include "collectives/strings.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/cli.h"
#include "common/parse.h"
#include "common/time.h"
#include "tests/collectives/reference.h"

using namespace pwm;
using namespace pwm::collectives;
using pwm::collectives::testing::expected_value;
using pwm::collectives::testing::input_value;

namespace {

// -b/-e: bytes from a number with an optional K, M or G suffix (powers of two), for `flag`.
size_t parse_size(const char* flag, const std::string& s) {
  std::string num = s;
  double mult = 1;
  if (!num.empty()) {
    switch (num.back()) {
      case 'K': case 'k': mult = 1 << 10; break;
      case 'M': case 'm': mult = 1 << 20; break;
      case 'G': case 'g': mult = 1 << 30; break;
      default: break;
    }
    if (mult > 1) num.pop_back();
  }
  const std::string what = fmt::format("{} {}: use a number of bytes with an optional K, M or G suffix (e.g. 64M)", flag, s);
  std::string bad = check_real_number(num);
  if (bad.empty() && num.find_first_not_of("0123456789.eE+-") != std::string::npos)
    bad = fmt::format("'{}' is not a decimal number", num);  // strtod's hex and the like
  if (num.empty() || !bad.empty()) PWM_THROW("{}{}", what, bad.empty() ? "" : " (" + bad + ")");
  const double v = std::strtod(num.c_str(), nullptr) * mult;
  if (!(v >= 0) || v > 1e15) PWM_THROW("{} {}: must be in [0, 1e15] bytes", flag, s);
  return static_cast<size_t>(v);
}

// MemAvailable of /proc/meminfo in bytes; -1 when unknown.
double available_memory() {
  long long kb = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
  }
  return kb < 0 ? -1.0 : 1024.0 * static_cast<double>(kb);
}

// --algo's comma list, empty items skipped.
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

// The collective a run sweeps (--op). The algorithms of AllReduce are collectives::Algorithm.
enum class Op { kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce, kAlltoall };

Op parse_op(const std::string& s) {
  if (s == "allreduce") return Op::kAllreduce;
  if (s == "reduce_scatter") return Op::kReduceScatter;
  if (s == "allgather") return Op::kAllgather;
  if (s == "broadcast") return Op::kBroadcast;
  if (s == "reduce") return Op::kReduce;
  if (s == "alltoall") return Op::kAlltoall;
  PWM_THROW("unknown --op '{}': use allreduce, reduce_scatter, allgather, broadcast, reduce or alltoall", s);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllreduce: return "allreduce";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllgather: return "allgather";
    case Op::kBroadcast: return "broadcast";
    case Op::kReduce: return "reduce";
    case Op::kAlltoall: return "alltoall";
  }
  return "?";
}

// AllGather and ReduceScatter: a row's size is the gathered or scattered total, n times the
// count of elements each rank sends or receives (nccl-tests' convention).
bool sized_by_total(Op op) { return op == Op::kAllgather || op == Op::kReduceScatter; }

// The ops that take --algo, and the one MPI call their `mpi` rows run.
bool takes_algo(Op op) { return op == Op::kAllreduce || op == Op::kAlltoall; }
const char* mpi_call(Op op) { return op == Op::kAlltoall ? "MPI_Alltoall" : "MPI_Allreduce"; }

// The algo column: AllReduce's algorithm; the other ops run their one algorithm.
std::string algo_label(Op op, Algorithm a) {
  switch (op) {
    case Op::kAllreduce:
    case Op::kAlltoall: return algorithm_name(a);
    case Op::kBroadcast:
    case Op::kReduce: return "tree";
    case Op::kReduceScatter:
    case Op::kAllgather: break;
  }
  return "ring";
}

// The flags. The *_s strings are bound to the flags as typed; resolve() parses them, on every
// rank, into the fields below them.
struct Options {
  std::string min_s = "8", max_s = "64M", op_s = "allreduce", algos_s = "ring,hd,rd,auto,mpi",
              dtype_s = "float", redop_s = "sum", json_path;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, inflight = 1, rounds = 1;
  bool in_place = false;
  bool algo_given = false;  // --algo on the command line (AllToAll's default list is its own)
  double timeout = 300;
  // Set by resolve().
  Op op = Op::kAllreduce;
  std::vector<Algorithm> algos;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop = ReduceOp::kSum;
  size_t minb = 0, maxb = 0;
};

// nccl-tests' flags (-b -e -f -n -w -c -d -o) and this bench's own.
void add_flags(CLI::App& app, Options& o) {
  app.add_option("-b,--minbytes", o.min_s, "smallest size (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_s, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "size multiplier between rows")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per row")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per row")->capture_default_str();
  app.add_option("-c,--check", o.check, "check every row's result (0/1)")->capture_default_str();
  app.add_option("--op", o.op_s, "allreduce|reduce_scatter|allgather|broadcast|reduce|alltoall")->capture_default_str()
      ->check(CLI::IsMember({"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall"}));
  app.add_option("--algo", o.algos_s,
                 "comma list of ring,hd,rd,auto,mpi (AllReduce) or pairwise,bruck,linear,auto,mpi (AllToAll; its "
                 "default); other ops use their one algorithm")->capture_default_str();
  app.add_option("-d,--datatype", o.dtype_s, "float|double|int32|int64")->capture_default_str();
  app.add_option("-o,--op_type", o.redop_s, "sum|max|min")->capture_default_str();
  app.add_flag("--inplace", o.in_place, "in-place operation (default out of place)");
  app.add_option("--rounds", o.rounds,
                 "measure each size's algorithms in this many rounds, alternating their order; a row's time is "
                 "the median over rounds, vs_mpi the median of the rounds' ratios with their range")
      ->capture_default_str();
  app.add_option("--inflight", o.inflight, "AllReduces in flight at once per iteration (time per AllReduce)")
      ->capture_default_str();
  app.add_option("--json", o.json_path, "also write the rows as JSON to this file");
  app.add_option("--coll-timeout", o.timeout, "collective watchdog timeout in seconds")->capture_default_str();
}

// Parses the modes and sizes of `o` and checks they go together. On every rank, inside
// run_mpi_main, so that a mistake ends the run with one error line; --json's file is probed by
// rank 0 here, to fail before the sweep rather than after it.
void resolve(Options& o, bool root, int ranks, int ranks_here) {
  auto named = [](const char* flag, auto parse) {  // the flag in front of a parser's message
    try {
      return parse();
    } catch (const Error& e) {
      PWM_THROW("{}: {}", flag, e.what());
    }
  };
  o.op = parse_op(o.op_s);
  o.dtype = named("-d/--datatype", [&] { return parse_dtype(o.dtype_s); });
  o.redop = named("-o/--op_type", [&] { return parse_reduce_op(o.redop_s); });
  if (!(o.factor >= 1.01 && o.factor <= 1e6)) PWM_THROW("-f/--stepfactor must be in [1.01, 1e6] (got {})", o.factor);
  if (o.iters < 1) PWM_THROW("-n/--iters must be at least 1 (got {})", o.iters);
  if (o.warmup < 0) PWM_THROW("-w/--warmup_iters must be >= 0 (got {})", o.warmup);
  if (o.rounds < 1 || o.rounds > 1000) PWM_THROW("--rounds must be in [1, 1000] (got {})", o.rounds);
  if (o.inflight < 1 || o.inflight > 64) PWM_THROW("--inflight must be in [1, 64] (got {})", o.inflight);
  if (o.check != 0 && o.check != 1) PWM_THROW("-c/--check must be 0 or 1 (got {})", o.check);
  if (!(o.timeout > 0 && o.timeout <= 1e9)) PWM_THROW("--coll-timeout must be > 0 seconds (got {})", o.timeout);
  if (takes_algo(o.op)) {
    const AlgorithmOp aop = o.op == Op::kAlltoall ? AlgorithmOp::kAlltoall : AlgorithmOp::kAllreduce;
    if (o.op == Op::kAlltoall && !o.algo_given) o.algos_s = "pairwise,bruck,linear,auto,mpi";
    for (auto& a : split(o.algos_s))
      o.algos.push_back(named("--algo", [&] {
        const Algorithm x = parse_algorithm(a);
        check_algorithm(aop, x);
        return x;
      }));
    if (o.algos.empty()) PWM_THROW("--algo '{}' names no algorithm: give a comma list of {}", o.algos_s,
                                   o.op == Op::kAlltoall ? "pairwise,bruck,linear,auto,mpi" : "ring,hd,rd,auto,mpi");
  } else {
    o.algos.push_back(Algorithm::kAuto);  // the op's own algorithm
  }
  if (o.inflight > 1 && (o.op != Op::kAllreduce || o.in_place))
    PWM_THROW("--inflight {} needs --op allreduce out of place (got --op {}{})", o.inflight, op_name(o.op),
              o.in_place ? " --inplace" : "");
  o.minb = parse_size("-b/--minbytes", o.min_s);
  o.maxb = parse_size("-e/--maxbytes", o.max_s);
  if (o.minb > o.maxb) PWM_THROW("-b {} is larger than -e {}", o.min_s, o.max_s);
  // The largest row's buffers on every rank of this host: send, receive and the in-flight ones
  // (AllGather's receive and ReduceScatter's send are the row's size already; AllToAll's are
  // the group's size times it).
  const double per_peer = o.op == Op::kAlltoall ? static_cast<double>(ranks) : 1.0;
  const double need = static_cast<double>(o.maxb) * per_peer * (2.0 + (o.inflight > 1 ? o.inflight : 0)) * ranks_here;
  if (const double have = available_memory(); have > 0 && need > have)
    PWM_THROW("-e {}: the largest row needs about {:.1f} GiB on this host ({} ranks) but {:.1f} GiB is available: "
              "use a smaller -e", o.max_s, need / (1 << 30), ranks_here, have / (1 << 30));
  if (!o.json_path.empty() && root) check_output_path("--json", o.json_path);
}

struct Row {
  Op op;
  Algorithm algo;
  DataType dtype;
  ReduceOp redop;
  size_t bytes, count;
  double time_us, algbw, busbw;
  size_t wrong;
  // --rounds > 1: the median and range over rounds of MPI's time / this row's time (0: none).
  double vs_mpi = 0, vs_lo = 0, vs_hi = 0;
};

// The collective of a run on one communicator: its sizes, bus factor, call, inputs and check.
struct Bench {
  Communicator& comm;
  Op op;
  DataType t;
  ReduceOp redop;
  bool in_place;
  int root = 0;

  // Elements each rank contributes / receives for a row of `bytes` total size (nccl-tests'
  // convention: size is the whole vector for AllReduce/Broadcast/Reduce, the gathered or
  // scattered total for AllGather/ReduceScatter).
  size_t count_for(size_t bytes) const {
    size_t c = bytes / dtype_size(t);
    if (sized_by_total(op)) c /= comm.size();
    return c;
  }
  // algbw = size / time x this: AllToAll's size is per peer, its algbw counts the n blocks.
  double alg_factor() const { return op == Op::kAlltoall ? comm.size() : 1.0; }
  // busbw = algbw x this: what each rank sends per byte of the row's size, so that busbw is
  // comparable across rank counts (nccl-tests' definition).
  double bus_factor() const {
    const double n = comm.size();
    if (op == Op::kAllreduce) return 2 * (n - 1) / n;
    if (sized_by_total(op) || op == Op::kAlltoall) return (n - 1) / n;
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
    switch (op) {
      case Op::kAllreduce: comm.allreduce(s, r, count, t, redop, a); break;
      case Op::kReduceScatter: comm.reduce_scatter(s, recv.data(), count, t, redop); break;
      case Op::kAllgather: comm.allgather(s, recv.data(), count, t); break;
      case Op::kBroadcast: comm.broadcast(s, count, t, root); break;
      case Op::kReduce: comm.reduce(s, recv.data(), count, t, redop, root); break;
      case Op::kAlltoall: comm.alltoall(s, r, count, t, a); break;
    }
  }

  // Inputs whose exact result is known (tests/collectives/reference.h); receive buffers -7.
  void fill(std::vector<std::byte>& send, std::vector<std::byte>& recv, size_t count) {
    const int r = comm.rank(), n = comm.size();
    size_t send_n = op == Op::kReduceScatter || op == Op::kAlltoall ? count * n : count;
    size_t recv_n = op == Op::kAllgather || op == Op::kAlltoall ? count * n : count;
    if (op == Op::kAlltoall)  // block j of rank r: what r sends j (reference.h)
      send = testing::make_buffer(t, send_n, [&](size_t i) { return testing::alltoall_value(r, static_cast<int>(i / count), i % count); });
    else if (op == Op::kBroadcast)
      send = testing::make_buffer(t, send_n, [&](size_t i) { return r == root ? input_value(root, i) : -7; });
    else
      send = testing::make_buffer(t, send_n, [&](size_t i) { return input_value(r, i); });
    recv = testing::make_buffer(t, recv_n, [](size_t) { return -7; });
  }

  // This rank's wrong elements after run() on fill()'s inputs.
  size_t check(std::vector<std::byte>& send, std::vector<std::byte>& recv, size_t count) {
    const int r = comm.rank(), n = comm.size();
    switch (op) {
      case Op::kAllreduce:
        return testing::count_wrong(t, in_place ? send : recv, count, [&](size_t i) { return expected_value(redop, n, i); });
      case Op::kReduceScatter:
        return testing::count_wrong(t, recv, count, [&](size_t i) { return expected_value(redop, n, r * count + i); });
      case Op::kAllgather:
        return testing::count_wrong(t, recv, count * n, [&](size_t i) { return input_value(static_cast<int>(i / count), i % count); });
      case Op::kBroadcast:
        return testing::count_wrong(t, send, count, [&](size_t i) { return input_value(root, i); });
      case Op::kReduce:
        if (r == root)
          return testing::count_wrong(t, recv, count, [&](size_t i) { return expected_value(redop, n, i); });
        break;
      case Op::kAlltoall:
        return testing::count_wrong(t, in_place ? send : recv, count * n, [&](size_t i) {
          return testing::alltoall_value(static_cast<int>(i / count), r, i % count);
        });
    }
    return 0;
  }
};

// One size's buffers: send and receive, and the K receive buffers of --inflight K.
struct Buffers {
  std::vector<std::byte> send, recv;
  std::vector<std::vector<std::byte>> recvs;
};

// -c 1: the elements wrong on any rank after algorithm `a`. With --inflight, every buffer of the
// last timed iteration; then one more call on fresh inputs, as the timed calls ran on inputs
// that earlier calls may have overwritten (in place, or a reduction into the send buffer).
// Leaves the buffers refilled for the next algorithm. Every rank must call.
size_t check_row(Bench& b, const Options& o, Algorithm a, Buffers& buf, size_t count) {
  int64_t wrong = 0;
  if (o.inflight > 1) {
    for (auto& r : buf.recvs) wrong += static_cast<int64_t>(b.check(buf.send, r, count));
    for (auto& r : buf.recvs) r = buf.recv;
  }
  b.fill(buf.send, buf.recv, count);
  b.run(a, buf.send, buf.recv, count);
  wrong += static_cast<int64_t>(b.check(buf.send, buf.recv, count));
  b.comm.allreduce(&wrong, &wrong, 1, DataType::kInt64, ReduceOp::kSum, Algorithm::kMpi);
  b.fill(buf.send, buf.recv, count);
  return static_cast<size_t>(wrong);
}

// One row: `warmup` untimed then `iters` timed iterations of algorithm `a` after a barrier. The
// time is the slowest rank's average per collective (per AllReduce with --inflight), as
// nccl-tests reports it. Every rank must call.
Row measure(Bench& b, const Options& o, Algorithm a, Buffers& buf, size_t count, size_t bytes) {
  auto once = [&] {
    if (o.inflight > 1) b.run_inflight(a, buf.send, buf.recvs, count);
    else b.run(a, buf.send, buf.recv, count);
  };
  for (int i = 0; i < o.warmup; ++i) once();
  b.comm.barrier();
  const double t0 = now_s();
  for (int i = 0; i < o.iters; ++i) once();
  double t_us = (now_s() - t0) * 1e6 / o.iters / o.inflight;
  b.comm.allreduce(&t_us, &t_us, 1, DataType::kFloat64, ReduceOp::kMax, Algorithm::kMpi);  // slowest rank
  const size_t wrong = o.check ? check_row(b, o, a, buf, count) : 0;
  const double algbw = t_us > 0 ? bytes * b.alg_factor() / t_us * 1e-3 : 0;  // GB/s
  return {o.op, a, b.t, b.redop, bytes, count, t_us, algbw, algbw * b.bus_factor(), wrong};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --rounds R: every algorithm measured R times, the order reversed every other round (ABC CBA
// ...), so that a drift of the machine's speed or the position in a round (the first algorithm
// of a size measured faster) falls on every candidate alike. A row's time is its median over
// rounds; against mpi, each round's ratio (the same round's MPI time / this time) gives the
// median and range. Every rank must call.
std::vector<Row> measure_rounds(Bench& b, const Options& o, Buffers& buf, size_t count, size_t bytes) {
  const size_t A = o.algos.size();
  std::vector<std::vector<double>> t(A);
  std::vector<Row> last(A);
  size_t wrong_sum = 0;
  for (int round = 0; round < o.rounds; ++round)
    for (size_t k = 0; k < A; ++k) {
      const size_t i = round % 2 ? A - 1 - k : k;
      last[i] = measure(b, o, o.algos[i], buf, count, bytes);
      t[i].push_back(last[i].time_us);
      wrong_sum += last[i].wrong;
    }
  const auto mpi = std::find(o.algos.begin(), o.algos.end(), Algorithm::kMpi);
  std::vector<Row> rows;
  for (size_t i = 0; i < A; ++i) {
    Row r = last[i];
    r.time_us = median_of(t[i]);
    r.algbw = r.time_us > 0 ? bytes * b.alg_factor() / r.time_us * 1e-3 : 0;
    r.busbw = r.algbw * b.bus_factor();
    r.wrong = i == 0 ? wrong_sum : 0;  // every round's check, counted once
    if (mpi != o.algos.end() && o.algos[i] != Algorithm::kMpi) {
      const std::vector<double>& tm = t[static_cast<size_t>(mpi - o.algos.begin())];
      std::vector<double> ratio;
      for (int k = 0; k < o.rounds; ++k) ratio.push_back(t[i][k] > 0 ? tm[k] / t[i][k] : 0);
      r.vs_mpi = median_of(ratio);
      r.vs_lo = *std::min_element(ratio.begin(), ratio.end());
      r.vs_hi = *std::max_element(ratio.begin(), ratio.end());
    }
    rows.push_back(r);
  }
  return rows;
}

// The run's settings and the column heads, as nccl-tests prints them.
void print_header(const Options& o, int ranks, size_t segment_bytes) {
  fmt::print("# collectives_bench: {} ranks, op {}, {} {}, {}, iters {} warmup {}, segment {} B, in flight {}\n",
             ranks, op_name(o.op), dtype_name(o.dtype), reduce_op_name(o.redop),
             o.in_place ? "in-place" : "out-of-place", o.iters, o.warmup, segment_bytes, o.inflight);
  fmt::print("#\n# {:>12} {:>12} {:>8} {:>6} {:>8} {:>10} {:>8} {:>8} {:>7} {:>7}\n", "size", "count",
             "type", "redop", "algo", "time(us)", "algbw", "busbw", "#wrong", "vs_mpi");
  fmt::print("# {:>12} {:>12} {:>8} {:>6} {:>8} {:>10} {:>8} {:>8} {:>7} {:>7}\n", "(B)", "(elements)", "",
             "", "", "", "(GB/s)", "(GB/s)", "", "(busbw)");
}

// One size's rows, printed once all are measured, each with its busbw as a ratio to MPI's at
// that size (when mpi is among --algo); flushed, so a long sweep shows its progress.
void print_rows(std::span<const Row> rows) {
  double mpi_busbw = 0;
  for (const Row& r : rows)
    if (r.algo == Algorithm::kMpi) mpi_busbw = r.busbw;
  for (const Row& r : rows) {
    std::string vs = mpi_busbw > 0 && r.algo != Algorithm::kMpi ? fmt::format("{:.2f}x", r.busbw / mpi_busbw) : "";
    if (r.vs_mpi > 0) vs = fmt::format("{:.2f}x ({:.2f}-{:.2f})", r.vs_mpi, r.vs_lo, r.vs_hi);
    fmt::print("  {:>12} {:>12} {:>8} {:>6} {:>8} {:>10.2f} {:>8.3f} {:>8.3f} {:>7} {:>7}\n", r.bytes, r.count,
               dtype_name(r.dtype), reduce_op_name(r.redop), algo_label(r.op, r.algo), r.time_us, r.algbw,
               r.busbw, r.wrong, vs);
    std::fflush(stdout);
  }
}

// The size sweep, -b to -e by a factor of -f, every algorithm of --algo at each size. Rank 0
// prints the rows (`root_prints`). Every rank must call.
std::vector<Row> sweep(Bench& b, const Options& o, bool root_prints) {
  std::vector<Row> rows;
  for (double sz = static_cast<double>(o.minb); sz <= static_cast<double>(o.maxb) * 1.0000001; sz *= o.factor) {
    const size_t count = b.count_for(static_cast<size_t>(sz));
    const size_t bytes = count * dtype_size(b.t) * (sized_by_total(o.op) ? b.comm.size() : 1);
    Buffers buf;
    b.fill(buf.send, buf.recv, count);
    buf.recvs.assign(o.inflight > 1 ? static_cast<size_t>(o.inflight) : 0, buf.recv);
    const size_t first = rows.size();
    if (o.rounds == 1) {
      for (Algorithm a : o.algos) rows.push_back(measure(b, o, a, buf, count, bytes));
    } else {
      for (Row& r : measure_rounds(b, o, buf, count, bytes)) rows.push_back(r);
    }
    if (root_prints) print_rows(std::span<const Row>(rows).subspan(first));
    if (count == 0 && sz == 0) break;
  }
  return rows;
}

// The geometric mean over the sizes in [lo, hi] bytes of algorithm a's time (use_time) or busbw
// as a ratio to MPI's (the mpi rows) at the same size; 0 when the sweep has no such size.
double geomean_vs_mpi(const std::vector<Row>& rows, Algorithm a, size_t lo, size_t hi, bool use_time) {
  double prod = 1;
  int k = 0;
  for (auto& r : rows) {
    if (r.algo != a || r.bytes < lo || r.bytes > hi) continue;
    for (auto& m : rows)
      if (m.algo == Algorithm::kMpi && m.bytes == r.bytes && m.time_us > 0 && r.time_us > 0) {
        prod *= use_time ? r.time_us / m.time_us : r.busbw / m.busbw;
        ++k;
      }
  }
  return k ? std::pow(prod, 1.0 / k) : 0.0;
}

// The footer: each algorithm's average busbw; for an AllReduce or AllToAll sweep that includes
// mpi, the acceptance ratios of issue 2 (large-message busbw, small-message time; AllToAll's
// sizes per peer); the wrong elements.
void print_summary(const Options& o, const std::vector<Row>& rows, size_t total_wrong) {
  fmt::print("#\n# Avg bus bandwidth per algorithm (GB/s):");
  for (Algorithm a : o.algos) {
    double sum = 0;
    int k = 0;
    for (auto& r : rows)
      if (r.algo == a) sum += r.busbw, ++k;
    fmt::print(" {} {:.3f}", algo_label(o.op, a), k ? sum / k : 0.0);
  }
  fmt::print("\n");
  if (takes_algo(o.op) && std::find(o.algos.begin(), o.algos.end(), Algorithm::kMpi) != o.algos.end()) {
    for (Algorithm a : o.algos) {
      if (a == Algorithm::kMpi) continue;
      double big = geomean_vs_mpi(rows, a, 4u << 20, 64u << 20, false);
      double small = geomean_vs_mpi(rows, a, 4, 4096, true);
      fmt::print("# {:>8}: busbw / {}'s, 4 MiB-64 MiB (geomean): {}   time / {}'s, 4 B-4 KiB (geomean): {}\n",
                 algorithm_name(a), mpi_call(o.op), big > 0 ? fmt::format("{:.2f}x", big) : "n/a",
                 mpi_call(o.op), small > 0 ? fmt::format("{:.2f}x", small) : "n/a");
    }
  }
  fmt::print("# Out of bounds values : {} {}\n", total_wrong, total_wrong ? "FAILED" : "OK");
}

// --json: the rows, written to a .tmp file and renamed, so a reader never sees half a file.
void write_json(const Options& o, int ranks, const std::vector<Row>& rows) {
  nlohmann::json j;
  j["ranks"] = ranks;
  j["inflight"] = o.inflight;
  j["rows"] = nlohmann::json::array();
  for (auto& r : rows)
    j["rows"].push_back({{"op", op_name(r.op)}, {"algo", algo_label(r.op, r.algo)}, {"dtype", dtype_name(r.dtype)},
                         {"bytes", r.bytes}, {"time_us", r.time_us}, {"algbw_gbps", r.algbw},
                         {"busbw_gbps", r.busbw}, {"wrong", r.wrong}, {"vs_mpi", r.vs_mpi},
                         {"vs_mpi_min", r.vs_lo}, {"vs_mpi_max", r.vs_hi}});
  write_file_atomic(o.json_path, j.dump(1) + "\n", "--json");
}

// The run on every rank, once the flags are read: throws on a bad flag or any wrong element.
int run(MpiEnvironment& env, Options& o) {
  CommOptions opts = CommOptions::from_env();
  opts.timeout_s = o.timeout;
  Communicator comm = Communicator::world(env.transport(), opts);
  const bool root_prints = env.rank() == 0;
  // Every rank resolves the flags and agrees on the verdict: a mistake (or rank 0's --json check)
  // is one line and a non-zero exit everywhere, before the sweep.
  const std::vector<std::string> hosts = allgather_strings(comm, env.processor_name());
  const int here = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[static_cast<size_t>(comm.rank())]));
  if (!agree_on_errors(comm, "collectives_bench", [&] { resolve(o, root_prints, comm.size(), here); })) return 1;
  Bench b{comm, o.op, o.dtype, o.redop, o.in_place};
  if (root_prints) print_header(o, comm.size(), opts.segment_bytes);
  const std::vector<Row> rows = sweep(b, o, root_prints);
  size_t total_wrong = 0;
  for (const Row& r : rows) total_wrong += r.wrong;
  if (root_prints) print_summary(o, rows, total_wrong);
  if (!o.json_path.empty() && root_prints) write_json(o, comm.size(), rows);
  if (total_wrong) PWM_THROW("{} wrong elements", total_wrong);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  CLI::App app{"collectives_bench: nccl-tests-style sweep of the pathways-mpi collectives against MPI"};
  Options o;
  add_flags(app, o);
  try {  // every rank parses the same argv and reaches the same verdict; rank 0 says it
    if (int code = 0; !parse_command_line(app, argc, argv, "collectives_bench", env.rank() == 0, code)) return code;
    o.algo_given = app.count("--algo") > 0;
  } catch (const Error& e) {
    if (env.rank() == 0) std::fprintf(stderr, "collectives_bench: error: %s\n", e.what());
    return 1;
  }
  return run_mpi_main(env, [&]() -> int { return run(env, o); });
}
