#include "collectives/mpi_transport.h"

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "common/check.h"

namespace pwm::collectives {

namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

// Every MPI return code is checked (docs/errors.md).
#define PWM_MPI(call)                                                                    \
  do {                                                                                   \
    int pwm_rc_ = (call);                                                                \
    if (pwm_rc_ != MPI_SUCCESS) [[unlikely]]                                             \
      PWM_THROW("{}:{}: {} failed: {}", "collectives/mpi_transport.cc", __LINE__, #call, \
                mpi_error_string(pwm_rc_));                                              \
  } while (0)

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

class MpiNativeOp : public NativeOp {
 public:
  explicit MpiNativeOp(MPI_Request r) : req_(r) {}
  bool test() override {
    int flag = 0;
    PWM_MPI(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }

 private:
  MPI_Request req_;
};

class MpiTransport : public Transport {
 public:
  MpiTransport() {
    PWM_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    PWM_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    PWM_MPI(MPI_Comm_rank(comm_, &rank_));
    PWM_MPI(MPI_Comm_size(comm_, &size_));
    void* attr = nullptr;
    int flag = 0;
    PWM_MPI(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &attr, &flag));
    max_tag_ = flag ? *static_cast<int*>(attr) : 32767;
  }
  ~MpiTransport() override {
    for (auto& [group, c] : group_comms_) MPI_Comm_free(&c);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int max_tag() const override { return max_tag_; }
  std::string name() const override { return "mpi"; }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override {
    MPI_Request r;
    PWM_CHECK_LE(bytes, static_cast<size_t>(INT32_MAX));
    PWM_MPI(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r));
    return from_mpi(r);
  }

  Request irecv(void* buf, size_t bytes, int peer, int tag) override {
    MPI_Request r;
    PWM_CHECK_LE(bytes, static_cast<size_t>(INT32_MAX));
    PWM_MPI(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r));
    return from_mpi(r);
  }

  bool test(Request& r, size_t* received) override {
    MPI_Request m = to_mpi(r);
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(&m, &flag, &st);
    if (rc != MPI_SUCCESS) {
      int err = rc == MPI_ERR_IN_STATUS ? st.MPI_ERROR : rc;
      PWM_THROW("MPI point-to-point failed (peer {}, tag {}): {}", st.MPI_SOURCE, st.MPI_TAG,
                mpi_error_string(err));
    }
    r = from_mpi(m);
    if (!flag) return false;
    if (received) {
      int count = 0;
      PWM_MPI(MPI_Get_count(&st, MPI_BYTE, &count));
      *received = static_cast<size_t>(count);
    }
    return true;
  }

  [[noreturn]] void abort(const std::string& message) override {
    MpiEnvironment::abort_job(message, 3);
  }

  std::unique_ptr<NativeOp> start_native_allreduce(const std::vector<int>& group, const void* send,
                                                   void* recv, size_t count, DataType dtype,
                                                   ReduceOp op) override {
    MPI_Comm c = group_comm(group);
    PWM_CHECK_LE(count, static_cast<size_t>(INT32_MAX));
    MPI_Request r;
    const void* s = send == recv ? MPI_IN_PLACE : send;
    PWM_MPI(MPI_Iallreduce(s, recv, static_cast<int>(count), mpi_type(dtype), mpi_op(op), c, &r));
    return std::make_unique<MpiNativeOp>(r);
  }

 private:
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
    PWM_MPI(MPI_Comm_group(comm_, &world_group));
    PWM_MPI(MPI_Group_incl(world_group, static_cast<int>(group.size()), group.data(), &g));
    MPI_Comm c;
    PWM_MPI(MPI_Comm_create_group(comm_, g, /*tag=*/4242, &c));
    MPI_Group_free(&g);
    MPI_Group_free(&world_group);
    PWM_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return group_comms_[group] = c;
  }

  MPI_Comm comm_dup_world() {
    MPI_Comm c;
    PWM_MPI(MPI_Comm_dup(comm_, &c));
    PWM_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return c;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, max_tag_ = 32767;
  std::map<std::vector<int>, MPI_Comm> group_comms_;
};

}  // namespace

std::unique_ptr<NativeOp> Transport::start_native_allreduce(const std::vector<int>&, const void*,
                                                            void*, size_t, DataType, ReduceOp) {
  PWM_THROW("algorithm 'mpi' needs the MPI transport (this transport is '{}')", name());
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int provided = 0;
  PWM_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  PWM_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  PWM_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  if (provided < MPI_THREAD_SERIALIZED && rank_ == 0)
    std::fprintf(stderr, "warning: MPI provides thread level %d < MPI_THREAD_SERIALIZED\n", provided);
  transport_ = std::make_shared<MpiTransport>();
}

MpiEnvironment::~MpiEnvironment() {
  transport_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string MpiEnvironment::processor_name() const {
  char buf[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(buf, &len);
  return std::string(buf, len);
}

void MpiEnvironment::abort_job(const std::string& message, int code) {
  if (!message.empty()) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; be sure.
}

int run_mpi_main(MpiEnvironment& env, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    MpiEnvironment::abort_job(fmt::format("error: [rank {}] {}", env.rank(), e.what()), 1);
  }
}

}  // namespace pwm::collectives
