// The collectives' transport over MPI (mpi_transport.h): MpiTransport, point-to-point on
// private duplicates of MPI_COMM_WORLD (one per channel: transport.h), messages past an int's
// count as derived datatypes, MPI's own collectives (algorithm 'mpi') on communicators made per
// group, and the clock sync at start-up. MPI's start and end, and the checks of MPI's return
// codes: mpi_environment.cc, mpi_impl.h.
#include "collectives/mpi_transport.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstring>
#include <utility>
#include <map>
#include <vector>

#include "collectives/clock_sync.h"
#include "collectives/mpi_impl.h"
#include "common/check.h"
#include "common/time.h"

#define PWM_MPI_SOURCE "collectives/mpi_transport.cc"

namespace pwm::collectives {

namespace {

static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request must fit a Request handle");

MPI_Request to_mpi(const Request& r) {
  MPI_Request m;
  std::memcpy(&m, &r.handle, sizeof(m));
  return m;
}

Request from_mpi(MPI_Request m) {
  Request r;
  std::memcpy(&r.handle, &m, sizeof(m));
  return r;
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
  }
  PWM_THROW("invalid dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  PWM_THROW("invalid reduce op");
}

// A native collective's requests, and what MPI reads until they complete: the in-place copy of
// the send buffer and the count and displacement arrays of the v-forms (MPI-3: unchanged until
// the non-blocking collective completes).
struct NativeArgs {
  std::vector<std::byte> send_copy;
  std::vector<int> ints;
  std::vector<MPI_Datatype> types;  // MPI_Ialltoallw's: freed here, once MPI no longer reads the array
  NativeArgs() = default;
  NativeArgs(const NativeArgs&) = delete;
  NativeArgs& operator=(const NativeArgs&) = delete;
  ~NativeArgs() {  // a destructor: must not throw
    for (MPI_Datatype& t : types)
      if (t != MPI_BYTE) PWM_MPI_REPORT(MPI_Type_free(&t));
  }
};

class MpiNativeOp : public NativeOp {
 public:
  explicit MpiNativeOp(std::vector<MPI_Request> r, std::unique_ptr<NativeArgs> args = nullptr)
      : reqs_(std::move(r)), args_(std::move(args)) {}
  bool test() override {
    int flag = 0;
    PWM_MPI(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  }

 private:
  std::vector<MPI_Request> reqs_;
  std::unique_ptr<NativeArgs> args_;
};

// Messages above this many bytes take the large-count path (a derived datatype); native
// reductions are split at it. MPI's limit unless a test lowers it.
size_t g_large_count_threshold = INT32_MAX;

// A committed datatype of `bytes` bytes for one send or receive of more than an int's count:
// k blocks of `chunk` bytes and the remainder, as one struct type. Freed at once after the call
// that uses it: MPI keeps a datatype alive while a pending operation uses it.
struct LargeBytes {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  explicit LargeBytes(size_t bytes) {
    const size_t chunk = std::min<size_t>(size_t{1} << 30, g_large_count_threshold);
    const size_t k = bytes / chunk, rem = bytes % chunk;
    PWM_CHECK_LE(k, static_cast<size_t>(INT32_MAX));
    MPI_Datatype block, blocks;
    PWM_MPI(MPI_Type_contiguous(static_cast<int>(chunk), MPI_BYTE, &block));
    PWM_MPI(MPI_Type_contiguous(static_cast<int>(k), block, &blocks));
    int lens[2] = {1, static_cast<int>(rem)};
    MPI_Aint disp[2] = {0, static_cast<MPI_Aint>(k * chunk)};
    MPI_Datatype types[2] = {blocks, MPI_BYTE};
    PWM_MPI(MPI_Type_create_struct(rem > 0 ? 2 : 1, lens, disp, types, &type));
    PWM_MPI(MPI_Type_commit(&type));
    PWM_MPI(MPI_Type_free(&blocks));
    PWM_MPI(MPI_Type_free(&block));
  }
  ~LargeBytes() { PWM_MPI_REPORT(MPI_Type_free(&type)); }  // a destructor: must not throw
  LargeBytes(const LargeBytes&) = delete;
  LargeBytes& operator=(const LargeBytes&) = delete;
};

class MpiTransport : public Transport {
 public:
  MpiTransport() {
    PWM_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    PWM_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    void* attr = nullptr;
    int flag = 0;
    PWM_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &flag));
    const int tag_ub = flag ? *static_cast<int*>(attr) : 32767;
    if (tag_ub < kWireTagLimit - 1)
      PWM_THROW("the MPI library's MPI_TAG_UB is {}, below the 32767 the MPI standard guarantees "
                "(and the collectives' wire tags need); this MPI library is not standard-conforming",
                tag_ub);
    // More ranks on this host than cores for them: then a rank that found nothing to do gives
    // its core away (idle()), as OpenMPI's mpi_yield_when_idle does inside its own waits; our
    // collectives poll with MPI_Test, where no library yields (MPICH never, OpenMPI only
    // when told).
    // Every rank's host, for the watchdog's report (one small allgather at start-up); the ranks
    // on this host are those with its name (MPI_COMM_TYPE_SHARED's split has no non-blocking
    // form, and every start-up exchange has a deadline).
    std::vector<char> names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME, 0);
    char mine[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    PWM_MPI(MPI_Get_processor_name(mine, &len));
    MPI_Request req;
    PWM_MPI(MPI_Iallgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                           MPI_COMM_WORLD, &req));
    wait_startup(req, "every rank's host name (an allgather)");
    int local_ranks = 0;
    for (int r = 0; r < size_; ++r) {
      hosts_.emplace_back(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
      local_ranks += hosts_.back() == mine;
    }
    yield_when_idle_ = local_ranks > static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    measure_clock_offsets();
    // One matching space per channel (transport.h). MPI_Comm_dup is collective over the world,
    // which is why every channel is made here, at start-up, and never later.
    channels_.resize(kChannels, MPI_COMM_NULL);
    for (MPI_Comm& c : channels_) {
      PWM_MPI(MPI_Comm_idup(MPI_COMM_WORLD, &c, &req));
      wait_startup(req, "the other ranks to duplicate MPI_COMM_WORLD (the transport's channels)");
      PWM_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    }
  }
  ~MpiTransport() override {  // a destructor: failures are reported, the other frees still run
    reap_abandoned();
    leak_abandoned();
    for (auto& [group, c] : group_comms_) PWM_MPI_REPORT(MPI_Comm_free(&c));
    for (MPI_Comm& c : channels_) PWM_MPI_REPORT(MPI_Comm_free(&c));
  }

  void free_request(Request& r) override {
    MPI_Request m = to_mpi(r);
    if (m != MPI_REQUEST_NULL) PWM_MPI_REPORT(MPI_Request_free(&m));  // (reported, not thrown: a destructor's)
    r = from_mpi(MPI_REQUEST_NULL);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  int64_t clock_offset_us(int rank) const override {
    return rank >= 0 && rank < size_ ? offsets_[static_cast<size_t>(rank)] : 0;
  }
  int64_t clock_error_us(int rank) const override {
    return rank >= 0 && rank < size_ ? errors_[static_cast<size_t>(rank)] : 0;
  }
  std::string host_of(int rank) const override {
    return rank >= 0 && rank < size_ ? hosts_[static_cast<size_t>(rank)] : "";
  }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override {
    MPI_Request r;
    if (bytes <= g_large_count_threshold) {
      PWM_MPI(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, wire_tag(tag), channel(tag), &r));
    } else {
      LargeBytes t(bytes);
      PWM_MPI(MPI_Isend(buf, 1, t.type, peer, wire_tag(tag), channel(tag), &r));
    }
    return from_mpi(r);
  }

  Request irecv(void* buf, size_t bytes, int peer, int tag) override {
    MPI_Request r;
    if (bytes <= g_large_count_threshold) {
      PWM_MPI(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, wire_tag(tag), channel(tag), &r));
    } else {
      LargeBytes t(bytes);
      PWM_MPI(MPI_Irecv(buf, 1, t.type, peer, wire_tag(tag), channel(tag), &r));
    }
    return from_mpi(r);
  }

  bool test(Request& r, size_t* received) override {
    MPI_Request m = to_mpi(r);
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(&m, &flag, &st);
    r = from_mpi(m);  // a failed request is freed too: never test its stale handle again
    if (rc != MPI_SUCCESS) {
      int err = rc == MPI_ERR_IN_STATUS ? st.MPI_ERROR : rc;
      int cls = 0;
      // Only to word the error thrown below: if MPI cannot classify `err`, that error is
      // still the one to throw (reported, then the generic message).
      PWM_MPI_REPORT(MPI_Error_class(err, &cls));
      // MPI writes no byte past the posted receive; the message's true length is not known.
      if (cls == MPI_ERR_TRUNCATE) PWM_THROW("MPI_ERR_TRUNCATE: a longer message arrived");
      PWM_THROW("MPI point-to-point failed (peer {}, tag {}): {}", st.MPI_SOURCE, st.MPI_TAG,
                mpi_error_string(err));
    }
    if (!flag) return false;
    if (received) {
      MPI_Count count = 0;  // MPI_Get_count's int would overflow past 2 GiB
      PWM_MPI(MPI_Get_elements_x(&st, MPI_BYTE, &count));
      *received = static_cast<size_t>(count);
    }
    return true;
  }

  bool cancel_recv(Request& r, bool* received) override {
    MPI_Request m = to_mpi(r);
    if (received) *received = false;
    if (m == MPI_REQUEST_NULL) return true;
    // MPI_Cancel marks it; the request then completes, withdrawn or (its message had matched)
    // received, and MPI_Test frees it either way. A failed cancel leaves it posted: the caller
    // tests it until it completes. A failed test is an end: MPI freed the request (test()).
    if (MPI_Cancel(&m) != MPI_SUCCESS) return false;
    int flag = 0, cancelled = 1;
    MPI_Status st;
    if (MPI_Test(&m, &flag, &st) != MPI_SUCCESS)
      flag = 1;
    else if (flag && MPI_Test_cancelled(&st, &cancelled) == MPI_SUCCESS && received)
      *received = cancelled == 0;
    r = from_mpi(flag ? MPI_REQUEST_NULL : m);
    return flag != 0;
  }

  bool take_message(int peer, int tag) override {
    MPI_Message msg;
    MPI_Status st;
    int flag = 0;
    PWM_MPI(MPI_Improbe(peer, wire_tag(tag), channel(tag), &flag, &msg, &st));
    if (!flag) return false;
    MPI_Count count = 0;
    PWM_MPI(MPI_Get_elements_x(&st, MPI_BYTE, &count));
    const size_t bytes = static_cast<size_t>(count);
    auto buf = std::make_shared<std::vector<char>>(std::max<size_t>(bytes, 1));
    MPI_Request r;
    if (bytes <= g_large_count_threshold) {
      PWM_MPI(MPI_Imrecv(buf->data(), static_cast<int>(bytes), MPI_BYTE, &msg, &r));
    } else {
      LargeBytes t(bytes);
      PWM_MPI(MPI_Imrecv(buf->data(), 1, t.type, &msg, &r));
    }
    Request req = from_mpi(r);
    abandon(req, std::move(buf));  // (kept until its bytes are in, then dropped)
    return true;
  }

  void idle() override {
    if (abandoned() > 0) reap_abandoned();
    if (yield_when_idle_) sched_yield();
  }

  [[noreturn]] void abort(const std::string& message) override {
    // The watchdogs of the ranks stuck in one collective fire within moments of each other, and
    // the first MPI_Abort ends them all (MPICH's at once). Print first, then wait a short grace
    // so that each of those ranks gets its own line out: the one waiting on the missing rank is
    // then in the report whichever rank aborts first.
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(kAbortGraceMs));
    MpiEnvironment::abort_job("", 3);
  }

  std::unique_ptr<NativeOp> start_native_allreduce(const std::vector<int>& group, const void* send,
                                                   void* recv, size_t count, DataType dtype,
                                                   ReduceOp op) override {
    // MPI counts are int, and predefined reductions need predefined datatypes, so a count past
    // the limit is reduced in consecutive pieces (started at once, matched in order by MPI).
    MPI_Comm c = group_comm(group);
    const size_t limit = std::max<size_t>(g_large_count_threshold / dtype_size(dtype), 1);
    std::vector<MPI_Request> reqs;
    for (size_t off = 0; off < count || reqs.empty(); off += limit) {
      const size_t n = std::min(limit, count - off);
      const size_t at = off * dtype_size(dtype);
      void* r = static_cast<char*>(recv) + at;
      const void* s = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + at;
      reqs.push_back(MPI_REQUEST_NULL);
      PWM_MPI(MPI_Iallreduce(s, r, static_cast<int>(n), mpi_type(dtype), mpi_op(op), c, &reqs.back()));
    }
    return std::make_unique<MpiNativeOp>(std::move(reqs));
  }

  std::unique_ptr<NativeOp> start_native_alltoall(const std::vector<int>& group, const void* send, void* recv,
                                                  size_t bytes_per_peer) override {
    // The v-form's in-place copy (MPI_IN_PLACE would do here, but one path for both forms).
    auto args = std::make_unique<NativeArgs>();
    send = in_place_copy(send, recv, bytes_per_peer * group.size(), *args);
    MPI_Comm c = group_comm(group);
    MPI_Request req;
    if (bytes_per_peer <= g_large_count_threshold) {
      const int n = static_cast<int>(bytes_per_peer);
      PWM_MPI(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, c, &req));
    } else {
      // One element per peer of a type whose extent is the block: MPI places block i at i x extent.
      LargeBytes t(bytes_per_peer);
      PWM_MPI(MPI_Ialltoall(send, 1, t.type, recv, 1, t.type, c, &req));
    }
    return std::make_unique<MpiNativeOp>(std::vector<MPI_Request>{req}, std::move(args));
  }

  std::unique_ptr<NativeOp> start_native_alltoallv(const std::vector<int>& group, const void* send,
                                                   const std::vector<size_t>& send_bytes, void* recv,
                                                   const std::vector<size_t>& recv_bytes) override {
    const size_t n = group.size();
    size_t stotal = 0, rtotal = 0;
    for (size_t i = 0; i < n; ++i) stotal += send_bytes[i], rtotal += recv_bytes[i];
    auto args = std::make_unique<NativeArgs>();
    send = in_place_copy(send, recv, stotal, *args);
    MPI_Comm c = group_comm(group);
    MPI_Request req;
    if (std::max(stotal, rtotal) > g_large_count_threshold)
      return alltoallw_large(c, send, send_bytes, recv, recv_bytes, std::move(args));
    // Byte counts and displacements, all below the int limit (checked above).
    std::vector<int>& v = args->ints;
    v.resize(4 * n);
    int* sc = v.data(), *sd = sc + n, *rc = sd + n, *rd = rc + n;
    for (size_t i = 0, so = 0, ro = 0; i < n; so += send_bytes[i], ro += recv_bytes[i], ++i) {
      sc[i] = static_cast<int>(send_bytes[i]), sd[i] = static_cast<int>(so);
      rc[i] = static_cast<int>(recv_bytes[i]), rd[i] = static_cast<int>(ro);
    }
    PWM_MPI(MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, c, &req));
    return std::make_unique<MpiNativeOp>(std::vector<MPI_Request>{req}, std::move(args));
  }

 private:
  // In place: the send blocks are copied to `args` first (the receives overwrite blocks MPI has
  // not sent yet). Returns where MPI reads the send blocks from.
  static const void* in_place_copy(const void* send, void* recv, size_t bytes, NativeArgs& args) {
    if (send != recv) return send;
    args.send_copy.assign(static_cast<const std::byte*>(send), static_cast<const std::byte*>(send) + bytes);
    return args.send_copy.data();
  }

  // An AllToAllv whose counts or displacements do not fit an int: MPI_Ialltoallw with, per peer,
  // one element of a type that holds the whole block at its byte offset (MPI_Aint: 64 bits), so
  // every int argument is 0 or 1. The arrays live in `args` until the op is destroyed.
  std::unique_ptr<NativeOp> alltoallw_large(MPI_Comm c, const void* send, const std::vector<size_t>& send_bytes,
                                            void* recv, const std::vector<size_t>& recv_bytes,
                                            std::unique_ptr<NativeArgs> args) {
    const size_t n = send_bytes.size();
    std::vector<int>& v = args->ints;
    v.assign(4 * n, 0);  // counts (0 or 1) then displacements (0), for send and receive
    std::vector<MPI_Datatype>& types = args->types;
    types.assign(2 * n, MPI_BYTE);
    std::vector<std::unique_ptr<LargeBytes>> blocks;
    auto place = [&](size_t bytes, size_t offset, int& count, MPI_Datatype& type) {
      if (bytes == 0) return;
      blocks.push_back(std::make_unique<LargeBytes>(bytes));
      const int one = 1;
      const MPI_Aint at = static_cast<MPI_Aint>(offset);
      PWM_MPI(MPI_Type_create_hindexed(1, &one, &at, blocks.back()->type, &type));
      PWM_MPI(MPI_Type_commit(&type));
      count = 1;
    };
    for (size_t i = 0, so = 0, ro = 0; i < n; so += send_bytes[i], ro += recv_bytes[i], ++i) {
      place(send_bytes[i], so, v[i], types[i]);
      place(recv_bytes[i], ro, v[2 * n + i], types[n + i]);
    }
    MPI_Request req;
    PWM_MPI(MPI_Ialltoallw(send, &v[0], &v[n], types.data(), recv, &v[2 * n], &v[3 * n], types.data() + n, c, &req));
    return std::make_unique<MpiNativeOp>(std::vector<MPI_Request>{req}, std::move(args));
  }

  // An MPI communicator over `group`, created on first use with MPI_Comm_create_group, which is
  // collective over the group's members only (other ranks are not involved).
  MPI_Comm group_comm(const std::vector<int>& group) {
    auto it = group_comms_.find(group);
    if (it != group_comms_.end()) return it->second;
    if (static_cast<int>(group.size()) == size_) {
      bool identity = true;
      for (int i = 0; i < size_; ++i) identity = identity && group[i] == i;
      if (identity) return group_comms_[group] = comm_dup_world();
    }
    MPI_Group world_group, g;
    PWM_MPI(MPI_Comm_group(channels_[0], &world_group));
    PWM_MPI(MPI_Group_incl(world_group, static_cast<int>(group.size()), group.data(), &g));
    MPI_Comm c;
    PWM_MPI(MPI_Comm_create_group(channels_[0], g, /*tag=*/4242, &c));
    PWM_MPI(MPI_Group_free(&g));
    PWM_MPI(MPI_Group_free(&world_group));
    PWM_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return group_comms_[group] = c;
  }

  MPI_Comm comm_dup_world() {
    MPI_Comm c;
    PWM_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &c));
    PWM_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return c;
  }

  MPI_Comm channel(int tag) const {
    const int ch = tag_channel(tag);
    PWM_CHECK(tag >= 0 && ch < kChannels, "logical tag {} outside [0, {}) (collectives/transport.h)", tag,
              kLogicalTagLimit);
    return channels_[ch];
  }

  std::vector<MPI_Comm> channels_;  // channels_[0] also hosts the communicators of group_comm
  int rank_ = 0, size_ = 1;
  bool yield_when_idle_ = false;
  std::vector<std::string> hosts_;  // by world rank
  std::vector<int64_t> offsets_;    // by world rank: its clock minus rank 0's (clock_sync.h)
  std::vector<int64_t> errors_;     // by world rank: the bound on the offset's error

  // Rank 0 pings every other rank in turn (kClockRounds round trips each, on MPI_COMM_WORLD,
  // which nothing else uses for point-to-point), estimates each offset and sends every rank the
  // table. Collective over the world; a few milliseconds at start-up.
  void measure_clock_offsets() {
    constexpr int kClockRounds = 16, kTag = 1;
    offsets_.assign(static_cast<size_t>(size_), 0);
    errors_.assign(static_cast<size_t>(size_), 0);
    if (rank_ == 0) {
      for (int r = 1; r < size_; ++r) {
        std::vector<ClockSample> samples(kClockRounds);
        const std::string what = fmt::format("world rank {} on {} to answer the clock sync", r, hosts_[static_cast<size_t>(r)]);
        for (ClockSample& s : samples) {
          int64_t ping = 0;
          std::vector<MPI_Request> reqs(2);
          s.t0 = now_us();
          PWM_MPI(MPI_Irecv(&s.peer, 1, MPI_INT64_T, r, kTag, MPI_COMM_WORLD, &reqs[1]));
          PWM_MPI(MPI_Isend(&ping, 1, MPI_INT64_T, r, kTag, MPI_COMM_WORLD, &reqs[0]));
          wait_startup(reqs, what);
          s.t1 = now_us();
        }
        const ClockOffset o = estimate_clock_offset(samples);
        offsets_[static_cast<size_t>(r)] = o.offset_us;
        errors_[static_cast<size_t>(r)] = o.error_us;
      }
    } else {
      // (rank 0 pings the ranks in turn: a rank may wait for the pings of those before it)
      const std::string what = fmt::format("world rank 0 on {} to run the clock sync", hosts_[0]);
      for (int k = 0; k < kClockRounds; ++k) {
        int64_t ping = 0;
        MPI_Request r;
        PWM_MPI(MPI_Irecv(&ping, 1, MPI_INT64_T, 0, kTag, MPI_COMM_WORLD, &r));
        wait_startup(r, what);
        const int64_t t = now_us();
        PWM_MPI(MPI_Isend(&t, 1, MPI_INT64_T, 0, kTag, MPI_COMM_WORLD, &r));
        wait_startup(r, what);
      }
    }
    std::vector<MPI_Request> reqs(2);
    PWM_MPI(MPI_Ibcast(offsets_.data(), size_, MPI_INT64_T, 0, MPI_COMM_WORLD, &reqs[0]));
    PWM_MPI(MPI_Ibcast(errors_.data(), size_, MPI_INT64_T, 0, MPI_COMM_WORLD, &reqs[1]));
    wait_startup(reqs, "the clock offsets from world rank 0");
  }
  std::map<std::vector<int>, MPI_Comm> group_comms_;
};

}  // namespace

std::shared_ptr<Transport> make_mpi_transport() { return std::make_shared<MpiTransport>(); }

void set_large_count_threshold_for_testing(size_t bytes) {
  PWM_CHECK(bytes > 0 && bytes <= static_cast<size_t>(INT32_MAX), "threshold {} out of (0, 2^31-1]", bytes);
  g_large_count_threshold = bytes;
}

std::unique_ptr<NativeOp> Transport::start_native_allreduce(const std::vector<int>&, const void*,
                                                            void*, size_t, DataType, ReduceOp) {
  PWM_THROW("algorithm 'mpi' needs the MPI transport (this transport is '{}')", name());
}

std::unique_ptr<NativeOp> Transport::start_native_alltoall(const std::vector<int>&, const void*, void*, size_t) {
  PWM_THROW("algorithm 'mpi' needs the MPI transport (this transport is '{}')", name());
}

std::unique_ptr<NativeOp> Transport::start_native_alltoallv(const std::vector<int>&, const void*,
                                                            const std::vector<size_t>&, void*,
                                                            const std::vector<size_t>&) {
  PWM_THROW("algorithm 'mpi' needs the MPI transport (this transport is '{}')", name());
}

}  // namespace pwm::collectives
