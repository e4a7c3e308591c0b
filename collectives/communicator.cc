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
  if (a != Algorithm::kAuto) return a;
  return options_.cost_model.pick_allreduce(bytes, size(), options_.segment_bytes);
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

Work Communicator::start(const char* op, Algorithm algo, DataType t, ReduceOp redop, size_t count,
                         int root, const std::function<void(Schedule&)>& build) {
  const CollectiveInfo info = make_info(op, algo, t, redop, count, root);
  // Call seq - kSeqWindow has this call's tag. Complete it on this rank first: every member
  // started it before this one (same order everywhere), so it can finish, and once this rank's
  // sends and receives of it are done, MPI's non-overtaking rule pairs each later message with a
  // receive of this call, never of the older one.
  auto& live = window_->live;
  while (!live.empty() && live.begin()->first + kSeqWindow <= info.seq) {
    live.begin()->second->wait();
    live.erase(live.begin());
  }
  Schedule s(t, redop, pool_);
  build(s);
  const int fp_tag = options_.fingerprint && size() > 1 ? make_tag(context_, info.seq, 1) : -1;
  auto e = std::make_unique<Executor>(*transport_, std::move(s), info, make_tag(context_, info.seq, 0), fp_tag,
                                      options_.timeout_s);
  e->track_in(window_);
  return Work(std::move(e));
}

Work Communicator::iallreduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op,
                              Algorithm algo) {
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const Algorithm a = resolve_allreduce(algo, count * dtype_size(t));
  if (a == Algorithm::kMpi) {
    const CollectiveInfo info = make_info("allreduce", a, t, op, count, -1);
    auto native = transport_->start_native_allreduce(group_, send, recv, count, t, op);
    return Work(std::make_unique<Executor>(*transport_, std::move(native), info, options_.timeout_s));
  }
  const int r = rank_, n = size();
  return start("allreduce", a, t, op, count, -1, [&](Schedule& s) {
    switch (a) {
      case Algorithm::kRing: return algo::allreduce_ring(s, r, n, send, recv, count, seg);
      case Algorithm::kHalvingDoubling: return algo::allreduce_halving_doubling(s, r, n, send, recv, count);
      case Algorithm::kRecursiveDoubling: return algo::allreduce_recursive_doubling(s, r, n, send, recv, count);
      default: PWM_THROW("unsupported allreduce algorithm {}", algorithm_name(a));
    }
  });
}

Work Communicator::ireduce_scatter(const void* send, void* recv, size_t count, DataType t, ReduceOp op) {
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const int r = rank_, n = size();
  return start("reduce_scatter", Algorithm::kRing, t, op, count, -1,
               [&](Schedule& s) { algo::reduce_scatter_ring(s, r, n, send, recv, count, seg); });
}

Work Communicator::iallgather(const void* send, void* recv, size_t count, DataType t) {
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const int r = rank_, n = size();
  return start("allgather", Algorithm::kRing, t, ReduceOp::kSum, count, -1,
               [&](Schedule& s) { algo::allgather_ring(s, r, n, send, recv, count, seg); });
}

Work Communicator::ibroadcast(void* buf, size_t count, DataType t, int root) {
  if (root < 0 || root >= size()) PWM_THROW("broadcast root {} is not a rank of a group of {}", root, size());
  const size_t seg = std::max<size_t>(options_.segment_bytes / dtype_size(t), 1);
  const int r = rank_, n = size();
  return start("broadcast", Algorithm::kAuto, t, ReduceOp::kSum, count, root,
               [&](Schedule& s) { algo::broadcast_binomial(s, r, n, buf, count, root, seg); });
}

Work Communicator::ireduce(const void* send, void* recv, size_t count, DataType t, ReduceOp op, int root) {
  if (root < 0 || root >= size()) PWM_THROW("reduce root {} is not a rank of a group of {}", root, size());
  const int r = rank_, n = size();
  return start("reduce", Algorithm::kAuto, t, op, count, root,
               [&](Schedule& s) { algo::reduce_binomial(s, r, n, send, recv, count, root); });
}

Work Communicator::ibarrier() {
  const int r = rank_, n = size();
  return start("barrier", Algorithm::kAuto, DataType::kInt32, ReduceOp::kSum, 0, -1,
               [&](Schedule& s) { algo::barrier_dissemination(s, r, n); });
}

}  // namespace pwm::collectives
