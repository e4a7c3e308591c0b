#include "collectives/communicator.h"

#include <algorithm>
#include <set>

#include "collectives/algorithms.h"
#include "collectives/executor.h"
#include "common/check.h"
#include "common/env.h"

namespace pwm::collectives {

namespace {

// Tag layout (collectives/transport.h: 15-bit wire tags on channels). Context c uses channel
// c / 64 and the wire tag (c mod 64) << 9 | (seq mod 256) << 1 | sub, where sub 0 carries the
// collective's data and 1 its debug fingerprint. Tags therefore repeat every kSeqWindow calls of
// one communicator; start() keeps at most kSeqWindow of them in flight (see there).
constexpr uint32_t kMaxContext = 1024;
constexpr uint32_t kContextsPerChannel = 64;
constexpr uint64_t kSeqWindow = 256;
static_assert(kMaxContext / kContextsPerChannel <= kCommunicatorChannels);
static_assert(kContextsPerChannel * kSeqWindow * 2 <= kWireTagLimit);

int make_tag(uint32_t context, uint64_t seq, int sub) {
  const int wire = static_cast<int>(((context % kContextsPerChannel) << 9) | ((seq % kSeqWindow) << 1) |
                                    static_cast<uint32_t>(sub));
  return logical_tag(static_cast<int>(context / kContextsPerChannel), wire);
}

}  // namespace

CommOptions CommOptions::from_env() {
  CommOptions o;
  o.timeout_s = env_double("PWM_COLL_TIMEOUT", o.timeout_s);
  o.fingerprint = env_int("PWM_COLL_DEBUG", 0) != 0;
  o.segment_bytes = static_cast<size_t>(env_int("PWM_COLL_SEGMENT_BYTES", static_cast<int64_t>(o.segment_bytes)));
  // (ranges: common/env.cc; MpiEnvironment refused a bad value at start-up)
  o.cost_model = CostModel::from_env();
  return o;
}

Work::Work() = default;
Work::Work(std::unique_ptr<Executor> e) : e_(std::move(e)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    if (e_) {
      try {
        e_->wait();
      } catch (...) {
      }
    }
    e_ = std::move(o.e_);
  }
  return *this;
}
Work::~Work() {
  if (e_ && !e_->done()) {
    try {
      e_->wait();
    } catch (...) {
      // Destructors must not throw; the error was (or will be) reported by the caller's own
      // wait, and the watchdog still ends a stuck job.
    }
  }
}

bool Work::test() {
  PWM_CHECK(e_ != nullptr, "test() on an empty Work");
  return e_->progress();
}

void Work::abandon() { e_.reset(); }  // (the executor's destructor abandons it)

void Work::wait() {
  PWM_CHECK(e_ != nullptr, "wait() on an empty Work");
  e_->wait();
}

Communicator::Communicator(std::shared_ptr<Transport> transport, std::vector<int> world_ranks,
                           uint32_t context, CommOptions options)
    : transport_(std::move(transport)), group_(std::move(world_ranks)), context_(context),
      options_(options), pool_(std::make_shared<ScratchPool>()), window_(std::make_shared<SeqWindow>()) {
  PWM_CHECK(transport_ != nullptr);
  PWM_CHECK(!group_.empty(), "a communicator needs at least one rank");
  if (context_ >= kMaxContext) PWM_THROW("communicator context {} out of range [0, {})", context_, kMaxContext);
  std::set<int> seen;
  for (size_t i = 0; i < group_.size(); ++i) {
    int w = group_[i];
    if (w < 0 || w >= transport_->size())
      PWM_THROW("communicator group names world rank {} but the world has {} ranks", w, transport_->size());
    if (!seen.insert(w).second) PWM_THROW("communicator group lists world rank {} twice", w);
    if (w == transport_->rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0)
    PWM_THROW("world rank {} is not a member of the communicator group it constructs", transport_->rank());
}

Communicator Communicator::world(std::shared_ptr<Transport> transport, CommOptions options) {
  std::vector<int> all(transport->size());
  for (int i = 0; i < transport->size(); ++i) all[i] = i;
  return Communicator(std::move(transport), std::move(all), 0, options);
}

Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

Algorithm Communicator::resolve_allreduce(Algorithm a, size_t bytes) const {
  check_algorithm(AlgorithmOp::kAllreduce, a);
  if (a != Algorithm::kAuto) return a;
  return options_.cost_model.pick_allreduce(bytes, size(), options_.segment_bytes);
}

Algorithm Communicator::resolve_alltoall(Algorithm a, size_t bytes_per_peer, bool equal_counts) const {
  check_algorithm(equal_counts ? AlgorithmOp::kAlltoall : AlgorithmOp::kAlltoallv, a);
  if (a != Algorithm::kAuto) return a;
  return options_.cost_model.pick_alltoall(bytes_per_peer, size(), equal_counts);
}

CollectiveInfo Communicator::make_info(const char* op, Algorithm algo, DataType t, ReduceOp redop,
                                      size_t count, int root) {
  CollectiveInfo info;
  info.op = op;
  info.algo = algo;
  info.dtype = t;
  info.redop = redop;
  info.seq = seq_++;
  info.context = context_;
  info.count = count;
  info.root = root;
  info.group = &group_;
  info.group_rank = rank_;
  return info;
}

Work Communicator::start(const CollectiveInfo& info, const std::function<void(Schedule&)>& build) {
  // Call seq - kSeqWindow has this call's tag. Complete it on this rank first: every member
  // started it before this one (same order everywhere), so it can finish, and once this rank's
  // sends and receives of it are done, MPI's non-overtaking rule pairs each later message with a
  // receive of this call, never of the older one.
  auto& live = window_->live;
  while (!live.empty() && live.begin()->first + kSeqWindow <= info.seq) {
    live.begin()->second->wait();
    live.erase(live.begin());
  }
  Schedule s(info.dtype, info.redop, pool_);
  build(s);
  const int fp_tag = options_.fingerprint && size() > 1 ? make_tag(context_, info.seq, 1) : -1;
  auto e = std::make_unique<Executor>(*transport_, std::move(s), info, make_tag(context_, info.seq, 0), fp_tag,
                                      options_.timeout_s);
  e->track_in(window_);
  return Work(std::move(e));
}

Work Communicator::start_native(const CollectiveInfo& info, std::unique_ptr<NativeOp> native) {
  return Work(std::make_unique<Executor>(*transport_, std::move(native), info, options_.timeout_s));
}

Work Communicator::iallreduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                              Algorithm algo) {
  return iallreduce_window(send, recv, count, t, op, Window{count, 0}, algo);
}

Work Communicator::iallreduce_window(const void* send, void* recv, size_t count, DataType t, ReduceOp op, Window w,
                                     Algorithm algo) {
  if (w.offset > w.total || count > w.total - w.offset)
    PWM_THROW("allreduce window: {} elements at offset {} do not fit in a vector of {}", count, w.offset, w.total);
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const Algorithm a = resolve_allreduce(algo, w.total * dtype_size(t));
  if (a == Algorithm::kMpi) {
    if (count != w.total)
      PWM_THROW("allreduce window: the mpi algorithm reduces in MPI's own order; it cannot reduce {} of {} elements "
                "as the whole vector", count, w.total);
    auto native = transport_->start_native_allreduce(group_, send, recv, count, t, op);
    return start_native(make_info("allreduce", a, t, op, count, -1), std::move(native));
  }
  const int r = rank_, n = size();
  return start(make_info("allreduce", a, t, op, count, -1), [&](Schedule& s) {
    switch (a) {
      // hd and rd reduce every element in the one tree of the group (docs/collectives.md,
      // "Determinism"): where it lies in the vector does not matter.
      case Algorithm::kRing: return algo::allreduce_ring(s, r, n, send, recv, count, seg, w.total, w.offset);
      case Algorithm::kHalvingDoubling: return algo::allreduce_halving_doubling(s, r, n, send, recv, count);
      default: return algo::allreduce_recursive_doubling(s, r, n, send, recv, count);  // (resolve checked it)
    }
  });
}

Work Communicator::ireduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op) {
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const int r = rank_, n = size();
  return start(make_info("reduce_scatter", Algorithm::kRing, t, op, count, -1),
               [&](Schedule& s) { algo::reduce_scatter_ring(s, r, n, send, recv, count, seg); });
}

Work Communicator::iallgather(const void* send, void* recv, size_t count, DataType t) {
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const int r = rank_, n = size();
  return start(make_info("allgather", Algorithm::kRing, t, ReduceOp::kSum, count, -1),
               [&](Schedule& s) { algo::allgather_ring(s, r, n, send, recv, count, seg); });
}

Work Communicator::ibroadcast(void* buf, size_t count, DataType t, int root) {
  if (root < 0 || root >= size()) PWM_THROW("broadcast root {} is not a rank of a group of {}", root, size());
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const int r = rank_, n = size();
  return start(make_info("broadcast", Algorithm::kAuto, t, ReduceOp::kSum, count, root),
               [&](Schedule& s) { algo::broadcast_binomial(s, r, n, buf, count, root, seg); });
}

Work Communicator::ireduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op, int root) {
  if (root < 0 || root >= size()) PWM_THROW("reduce root {} is not a rank of a group of {}", root, size());
  const int r = rank_, n = size();
  return start(make_info("reduce", Algorithm::kAuto, t, op, count, root),
               [&](Schedule& s) { algo::reduce_binomial(s, r, n, send, recv, count, root); });
}

Work Communicator::ibarrier() {
  const int r = rank_, n = size();
  return start(make_info("barrier", Algorithm::kAuto, DataType::kInt32, ReduceOp::kSum, 0, -1),
               [&](Schedule& s) { algo::barrier_dissemination(s, r, n); });
}

Work Communicator::ialltoall(const void* send, void* recv, size_t count, DataType t, Algorithm algo) {
  const Algorithm a = resolve_alltoall(algo, count * dtype_size(t));
  if (a == Algorithm::kMpi) {
    auto native = transport_->start_native_alltoall(group_, send, recv, count * dtype_size(t));
    return start_native(make_info("alltoall", a, t, ReduceOp::kSum, count, -1), std::move(native));
  }
  const int r = rank_, n = size();
  const std::vector<size_t> counts(static_cast<size_t>(n), count);
  return start(make_info("alltoall", a, t, ReduceOp::kSum, count, -1), [&](Schedule& s) {
    switch (a) {
      case Algorithm::kBruck: return algo::alltoall_bruck(s, r, n, send, recv, count);
      case Algorithm::kLinear: return algo::alltoallv_linear(s, r, n, send, counts, recv, counts);
      default: return algo::alltoallv_pairwise(s, r, n, send, counts, recv, counts);  // (resolve checked it)
    }
  });
}

Work Communicator::ialltoallv(const void* send, std::span<const size_t> send_counts, void* recv,
                              std::span<const size_t> recv_counts, DataType t, Algorithm algo) {
  const size_t n = group_.size();
  if (send_counts.size() != n || recv_counts.size() != n)
    PWM_THROW("alltoallv: send_counts has {} entries and recv_counts {}, for a group of {} (one per member)",
              send_counts.size(), recv_counts.size(), n);
  if (send_counts[rank_] != recv_counts[rank_])
    PWM_THROW("alltoallv: group rank {} sends {} elements to itself but receives {} from itself", rank_,
              send_counts[rank_], recv_counts[rank_]);
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  const Algorithm a = resolve_alltoall(algo, total / n * dtype_size(t), /*equal_counts=*/false);
  std::unique_ptr<NativeOp> native;
  if (a == Algorithm::kMpi) {  // started before the call takes its sequence number: it may throw
    std::vector<size_t> sb(n), rb(n);
    for (size_t i = 0; i < n; ++i) sb[i] = send_counts[i] * dtype_size(t), rb[i] = recv_counts[i] * dtype_size(t);
    native = transport_->start_native_alltoallv(group_, send, sb, recv, rb);
  }
  CollectiveInfo info = make_info("alltoallv", a, t, ReduceOp::kSum, total, -1);
  info.send_counts = send_counts;
  info.recv_counts = recv_counts;
  if (native) return start_native(info, std::move(native));
  const int r = rank_;
  return start(info, [&](Schedule& s) {
    if (a == Algorithm::kLinear) return algo::alltoallv_linear(s, r, static_cast<int>(n), send, send_counts, recv, recv_counts);
    algo::alltoallv_pairwise(s, r, static_cast<int>(n), send, send_counts, recv, recv_counts);
  });
}

std::vector<size_t> Communicator::alltoall_counts(std::span<const size_t> send_counts) {
  if (send_counts.size() != group_.size())
    PWM_THROW("alltoall_counts: send_counts has {} entries for a group of {} (one per member)", send_counts.size(),
              group_.size());
  std::vector<int64_t> out(send_counts.size()), in(send_counts.begin(), send_counts.end());
  alltoall(in.data(), out.data(), 1, DataType::kInt64);
  return std::vector<size_t>(out.begin(), out.end());
}

ContextDrain::ContextDrain(std::shared_ptr<Transport> t, uint32_t context, std::map<int, uint64_t> left)
    : t_(std::move(t)), context_(context), left_(std::move(left)) {
  PWM_CHECK(t_ != nullptr);
  if (context_ >= kMaxContext) PWM_THROW("communicator context {} out of range [0, {})", context_, kMaxContext);
  std::erase_if(left_, [](const auto& kv) { return kv.second == 0; });
}

bool ContextDrain::progress() {
  for (auto it = left_.begin(); it != left_.end();) {
    auto& [peer, n] = *it;
    for (uint64_t seq = 0; seq < kSeqWindow && n > 0; ++seq)
      for (int sub = 0; sub < 2 && n > 0; ++sub)
        while (n > 0 && t_->take_message(peer, make_tag(context_, seq, sub))) {
          t_->count_message(context_, peer, false);
          --n;
        }
    it = n == 0 ? left_.erase(it) : std::next(it);
  }
  return left_.empty();
}

uint64_t ContextDrain::left() const {
  uint64_t n = 0;
  for (const auto& [peer, k] : left_) n += k;
  return n;
}

}  // namespace pwm::collectives
