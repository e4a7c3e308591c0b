#include "collectives/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "common/time.h"

namespace pwm::collectives {

namespace {

constexpr size_t kFingerprintWords = 8;
constexpr uint64_t kFingerprintMagic = 0x70776d66'70000001ull;  // "pwmfp", version 1

const char* kOpNames[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                          "barrier", "alltoall", "alltoallv"};
constexpr uint64_t kAlltoallvCode = 7;  // its count word is the pair's count (start_fingerprint)

uint64_t op_code(const char* op) {
  for (uint64_t i = 0; i < std::size(kOpNames); ++i)
    if (std::strcmp(kOpNames[i], op) == 0) return i;
  return 99;
}

std::string describe_fingerprint(const uint64_t* f) {
  const char* op = f[1] < std::size(kOpNames) ? kOpNames[f[1]] : "?";
  return fmt::format("{}({}, {}, {}, count={}, root={}, seq={})", op,
                     algorithm_name(static_cast<Algorithm>(f[2])),
                     dtype_name(static_cast<DataType>(f[3])),
                     reduce_op_name(static_cast<ReduceOp>(f[4])), f[5],
                     static_cast<int64_t>(f[6]), f[7]);
}

}  // namespace

std::string CollectiveInfo::describe() const {
  std::string g = group ? fmt::format("[{}]", fmt::join(*group, ",")) : "[]";
  std::string extra = root >= 0 ? fmt::format(", root={}", root) : "";
  return fmt::format("{}({}, {}, {}, count={}, bytes={}{}, seq={}, context={}, group={})", op,
                     algorithm_name(algo), dtype_name(dtype), reduce_op_name(redop), count,
                     count * dtype_size(dtype), extra, seq, context, g);
}

Executor::Executor(Transport& transport, Schedule&& schedule, CollectiveInfo info, int tag,
                   int fingerprint_tag, double timeout_s)
    : t_(transport), sched_(std::move(schedule)), info_(info), tag_(tag), timeout_s_(timeout_s),
      start_us_(now_us()), last_us_(start_us_), owner_(BufferOwnerScope::current()) {
  state_.assign(sched_.steps().size(), 0);
  req_.resize(sched_.steps().size());
  size_t n = info_.group ? info_.group->size() : 1;
  send_blocked_.assign(n, 0);
  recv_blocked_.assign(n, 0);
  if (fingerprint_tag >= 0) start_fingerprint(fingerprint_tag);
}

Executor::Executor(Transport& transport, std::unique_ptr<NativeOp> native, CollectiveInfo info,
                   double timeout_s)
    : t_(transport), sched_(info.dtype, info.redop, nullptr), info_(info), tag_(-1),
      timeout_s_(timeout_s), start_us_(now_us()), last_us_(start_us_), native_(std::move(native)) {}

Executor::~Executor() {
  if (!done_) abandon();
  if (window_) {
    auto it = window_->live.find(info_.seq);
    if (it != window_->live.end() && it->second == this) window_->live.erase(it);
  }
}

void Executor::track_in(std::shared_ptr<SeqWindow> window) {
  window_ = std::move(window);
  window_->live[info_.seq] = this;
}

void Executor::start_fingerprint(int fingerprint_tag) {
  // Every member sends its fingerprint to every other member (debug mode only: O(n^2) tiny
  // messages), then compares. Fixed size, so the exchange itself cannot mismatch.
  const auto& group = *info_.group;
  const size_t n = group.size();
  fp_tag_ = fingerprint_tag;
  fp_buf_.assign(n * kFingerprintWords, 0);
  uint64_t* mine = &fp_buf_[info_.group_rank * kFingerprintWords];
  mine[0] = kFingerprintMagic;
  mine[1] = op_code(info_.op);
  mine[2] = static_cast<uint64_t>(info_.algo);
  mine[3] = static_cast<uint64_t>(info_.dtype);
  mine[4] = static_cast<uint64_t>(info_.redop);
  mine[5] = info_.count;
  mine[6] = static_cast<uint64_t>(static_cast<int64_t>(info_.root));
  mine[7] = info_.seq;
  // What each member is sent: this rank's words; for alltoallv the count word is what this rank
  // sends that member, and what it expects back is its receive count from the member (read now:
  // the caller's spans are not needed after the call).
  fp_send_.assign(n * kFingerprintWords, 0);
  fp_expect_.assign(n, info_.count);
  fp_sched_ = std::make_unique<Schedule>(DataType::kInt64, ReduceOp::kSum, nullptr);
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<int>(p) == info_.group_rank) continue;
    uint64_t* out = &fp_send_[p * kFingerprintWords];
    std::copy(mine, mine + kFingerprintWords, out);
    if (!info_.send_counts.empty()) {
      out[5] = info_.send_counts[p];
      fp_expect_[p] = info_.recv_counts[p];
    }
    fp_sched_->send(static_cast<int>(p), out, kFingerprintWords);
    fp_sched_->recv(static_cast<int>(p), &fp_buf_[p * kFingerprintWords], kFingerprintWords);
  }
  fp_state_.assign(fp_sched_->steps().size(), 0);
  fp_req_.resize(fp_sched_->steps().size());
}

void Executor::check_fingerprints() {
  const auto& group = *info_.group;
  for (size_t p = 0; p < group.size(); ++p) {
    if (static_cast<int>(p) == info_.group_rank) continue;
    uint64_t want[kFingerprintWords];
    std::copy_n(&fp_buf_[info_.group_rank * kFingerprintWords], kFingerprintWords, want);
    want[5] = fp_expect_[p];
    const uint64_t* theirs = &fp_buf_[p * kFingerprintWords];
    if (std::memcmp(want, theirs, sizeof want) != 0) {
      const std::string pair = want[1] == kAlltoallvCode && theirs[1] == kAlltoallvCode
          ? fmt::format("; an alltoallv's count is the pair's: world rank {} receives count={} from world rank {}, "
                        "which sends it count={}", group[info_.group_rank], want[5], group[p], theirs[5])
          : "";
      PWM_THROW(
          "collective mismatch (PWM_COLL_DEBUG): world rank {} called {} but world rank {} "
          "called {} (context {}, group [{}]){}",
          group[info_.group_rank], describe_fingerprint(want), group[p],
          describe_fingerprint(theirs), info_.context, fmt::join(group, ","), pair);
    }
  }
  fp_sched_.reset();
}

bool Executor::progress_schedule(Schedule& s, std::vector<uint8_t>& state,
                                 std::vector<Request>& req, std::vector<uint32_t>& active,
                                 uint32_t& first, int tag) {
  const auto& steps = s.steps();
  const auto& deps = s.deps();
  const size_t elem = s.elem();
  const std::vector<int>& group = *info_.group;
  bool progressed = true;
  while (progressed) {
    progressed = false;
    // 1. Test what is in flight.
    for (size_t i = 0; i < active.size();) {
      uint32_t id = active[i];
      size_t got = 0;
      const Step& st = steps[id];
      bool complete = false;
      try {
        complete = t_.test(req[id], &got);
      } catch (const std::exception& e) {
        // MPI reports a message longer than the posted receive as an error (MPI_ERR_TRUNCATE)
        // and writes no byte past the buffer; name the collective, the sizes and the peer.
        PWM_THROW("collective mismatch: world rank {}{} in {}: the message from world rank {}{} did not fit "
                  "the {} bytes this rank expects ({}); the ranks called different collectives (set "
                  "PWM_COLL_DEBUG=1 to name both calls)",
                  t_.rank(), t_.on_host(t_.rank()), info_.describe(), group[st.peer], t_.on_host(group[st.peer]),
                  st.count * elem, e.what());
      }
      if (complete) {
        if (st.kind == StepKind::kRecv) t_.count_message(info_.context, group[st.peer], false);
        if (st.kind == StepKind::kRecv && got != st.count * elem)
          PWM_THROW("collective mismatch: world rank {}{} in {}: received {} bytes from world rank {}{} where {} "
                    "were expected; the ranks called different collectives (set PWM_COLL_DEBUG=1 to name both "
                    "calls)",
                    t_.rank(), t_.on_host(t_.rank()), info_.describe(), got, group[st.peer], t_.on_host(group[st.peer]),
                    st.count * elem);
        state[id] = 2;
        active[i] = active.back();
        active.pop_back();
        progressed = true;
      } else {
        ++i;
      }
    }
    // 2. Post or run every step whose dependencies are done, keeping per-peer FIFO order.
    std::fill(send_blocked_.begin(), send_blocked_.end(), 0);
    std::fill(recv_blocked_.begin(), recv_blocked_.end(), 0);
    for (uint32_t id = first; id < steps.size(); ++id) {
      if (state[id] != 0) continue;
      const Step& st = steps[id];
      bool ready = true;
      for (uint32_t d = st.dep_begin; d < st.dep_end && ready; ++d) ready = state[deps[d]] == 2;
      switch (st.kind) {
        case StepKind::kSend:
        case StepKind::kRecv: {
          const bool is_send = st.kind == StepKind::kSend;
          std::vector<uint8_t>& blocked = is_send ? send_blocked_ : recv_blocked_;
          if (blocked[st.peer]) break;  // an earlier message to/from this peer is not posted yet
          if (!ready) {
            blocked[st.peer] = 1;
            break;
          }
          const size_t bytes = st.count * elem;
          req[id] = is_send ? t_.isend(st.a, bytes, group[st.peer], tag) : t_.irecv(st.dst, bytes, group[st.peer], tag);
          if (is_send) t_.count_message(info_.context, group[st.peer], true);
          state[id] = 1;
          active.push_back(id);
          progressed = true;
          break;
        }
        case StepKind::kReduce:
          if (!ready) break;
          reduce_into(st.dst, st.a, st.b, st.count, s.dtype(), s.op());
          state[id] = 2;
          progressed = true;
          break;
        case StepKind::kCopy:
          if (!ready) break;
          if (st.count > 0 && st.dst != st.a) std::memcpy(st.dst, st.a, st.count * elem);
          state[id] = 2;
          progressed = true;
          break;
      }
    }
    while (first < steps.size() && state[first] == 2) ++first;
    if (first == steps.size()) return true;
  }
  return false;
}

bool Executor::progress() {
  if (done_) return true;
  // A failed collective (a size mismatch, a fingerprint mismatch, a transport error) ends the
  // job here, without unwinding: its other sends and receives, and those of every other
  // collective in flight, are still posted on buffers that unwinding would free while MPI may
  // still write into them (or read from them), and the peers' tags are out of step anyway.
  std::string failure;
  try {
    if (native_) {
      done_ = native_->test();
    } else {
      bool fp_done = true;
      if (fp_sched_) {
        fp_done = progress_schedule(*fp_sched_, fp_state_, fp_req_, fp_active_, fp_first_, fp_tag_);
        if (fp_done) check_fingerprints();
      }
      if (fp_done) done_ = progress_schedule(sched_, state_, req_, active_, first_, tag_);
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) t_.abort(failure + "; aborting the job");
  if (done_) owner_.reset();  // (MPI is done with the caller's buffers: their lifetime is the caller's again)
  if (!done_) {
    // More than half the timeout since this rank last looked: it did not run (it was stopped,
    // or computed between two tests of a non-blocking collective). The peers are given that
    // time back, so a rank resumed after a SIGSTOP does not blame the peers it kept waiting.
    const int64_t now = now_us();
    if (now - last_us_ > timeout_s_ * 0.5e6) start_us_ += now - last_us_;
    last_us_ = now;
    if (now - start_us_ > timeout_s_ * 1e6) fire_watchdog();
  }
  return done_;
}

void Executor::wait() {
  while (!progress()) {
    t_.idle();
    t_.run_wait_hook();
  }
}

void Executor::abandon() noexcept {
  // Only the wait hook's Interrupted leaves a collective unfinished (a failure aborts in
  // progress(), and Work's destructor waits): the run was cancelled because a peer was lost.
  if (native_)
    t_.abort(fmt::format("world rank {}: {} was interrupted (a peer was lost) but runs in MPI's own library, which "
                         "cannot withdraw it; aborting the job (in-job recovery needs the project's algorithms)",
                         t_.rank(), info_.describe()));
  std::vector<std::pair<Request*, int>> arriving;  // receives whose message matched: (request, peer)
  std::vector<Request*> sends;                      // posted sends: MPI may still read their buffers
  auto withdraw = [&](const Schedule* s, std::vector<uint8_t>& state, std::vector<Request>& req) {
    if (!s) return;
    for (uint32_t id = 0; id < s->steps().size(); ++id) {
      if (state[id] != 1) continue;
      const int peer = (*info_.group)[s->steps()[id].peer];
      bool taken = false;
      if (s->steps()[id].kind == StepKind::kSend)
        sends.push_back(&req[id]);
      else if (!t_.cancel_recv(req[id], &taken))
        arriving.push_back({&req[id], peer});
      else if (taken)
        t_.count_message(info_.context, peer, false);  // (its message had matched: it is not left to drain)
    }
  };
  withdraw(&sched_, state_, req_);
  withdraw(fp_sched_.get(), fp_state_, fp_req_);
  if (!sends.empty()) {
    // The sends read the caller's buffers (kept by the owner it named when it started) and this
    // collective's own (the schedule's scratch, the fingerprints): the transport keeps both until
    // MPI is done with the sends (Transport::abandon).
    auto left = std::make_shared<LeftBuffers>(
        LeftBuffers{std::move(sched_), std::move(fp_sched_), std::move(fp_send_), std::move(fp_buf_), owner_});
    for (Request* r : sends) t_.abandon(*r, left);
  }
  const int64_t deadline = now_us() + static_cast<int64_t>(std::min(timeout_s_, 10.0) * 1e6);
  while (!arriving.empty()) {
    std::erase_if(arriving, [&](auto& a) {
      try {
        if (!t_.test(*a.first, nullptr)) return false;
        t_.count_message(info_.context, a.second, false);  // (its message was taken)
        return true;
      } catch (const std::exception&) {
        return true;  // (a failed request is over: MPI freed it)
      }
    });
    if (arriving.empty()) break;
    if (now_us() > deadline)
      t_.abort(fmt::format("world rank {}: {} was interrupted, and its receive from world rank {}{} neither completes "
                           "nor can be withdrawn; aborting the job",
                           t_.rank(), info_.describe(), arriving.front().second, t_.on_host(arriving.front().second)));
    t_.idle();
    try {
      t_.run_wait_hook();  // (the heartbeat, while this lasts; its Interrupted is the one being handled)
    } catch (...) {
    }
  }
  done_ = true;
}

void Executor::fire_watchdog() {
  // Name the peers this rank is waiting for: posted receives first (their sender has not
  // arrived), else posted sends (their receiver has not posted), else blocked steps.
  const std::vector<int>& group = *info_.group;
  std::set<int> recv_from, send_to;
  bool in_fp = fp_sched_ != nullptr;
  const Schedule& s = in_fp ? *fp_sched_ : sched_;
  const auto& state = in_fp ? fp_state_ : state_;
  for (uint32_t id = 0; id < s.steps().size(); ++id) {
    const Step& st = s.steps()[id];
    if (state[id] == 2 || st.peer < 0) continue;
    if (st.kind == StepKind::kRecv) recv_from.insert(group[st.peer]);
    if (st.kind == StepKind::kSend && state[id] == 1) send_to.insert(group[st.peer]);
  }
  // Where the awaited ranks run: on a cluster the host is what an operator looks at first.
  auto where = [&](const std::set<int>& ranks) {
    std::vector<std::string> h;
    for (int r : ranks)
      if (std::string host = t_.host_of(r); !host.empty()) h.push_back(fmt::format("{} on {}", r, host));
    return h.empty() ? std::string() : fmt::format(" [world rank {}]", fmt::join(h, ", "));
  };
  std::string waiting;
  if (native_)
    waiting = "inside MPI's native collective (MPI does not say which peer)";
  else if (!recv_from.empty())
    waiting = fmt::format("waiting for world rank(s) {} to send{}", fmt::join(recv_from, ","), where(recv_from));
  else if (!send_to.empty())
    waiting = fmt::format("waiting for world rank(s) {} to receive{}", fmt::join(send_to, ","), where(send_to));
  else
    waiting = "with no message outstanding";
  t_.abort(fmt::format(
      "collective watchdog: world rank {}{} timed out after {:.1f} s in {}{}, {}; aborting the job "
      "(timeout: PWM_COLL_TIMEOUT or --coll-timeout)",
      t_.rank(), t_.on_host(t_.rank()), timeout_s_, info_.describe(), in_fp ? " (fingerprint exchange)" : "", waiting));
  std::abort();  // not reached (Transport::abort does not return), but GCC does not see
                 // [[noreturn]] through a virtual call
}

}  // namespace pwm::collectives
