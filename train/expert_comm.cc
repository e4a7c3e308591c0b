#include "train/expert_comm.h"

#include <fmt/format.h>

#include <memory>
#include <span>

#include "common/time.h"

namespace pwm::train {

model::ExpertComm<float> expert_alltoall(collectives::Communicator* c, std::vector<double*> seconds, Trace* trace) {
  model::ExpertComm<float> e;
  if (c == nullptr) return e;
  e.size = c->size();
  const auto add = [seconds](int64_t t0, int64_t t1) {
    for (double* s : seconds) *s += static_cast<double>(t1 - t0) * 1e-6;
  };
  e.counts = [c, add](const int64_t* send, int64_t* recv, int64_t per) {
    const int64_t t0 = now_us();
    c->alltoall(send, recv, static_cast<size_t>(per), collectives::DataType::kInt64);
    add(t0, now_us());
  };
  // The per-member element counts, kept with the functions and reused by every call.
  auto counts = std::make_shared<std::vector<size_t>>(2 * static_cast<size_t>(c->size()));
  e.rows = [c, add, trace, counts](const float* send, const int64_t* send_rows, float* recv, const int64_t* recv_rows,
                                   int64_t width) {
    const int64_t t0 = now_us();
    const size_t P = static_cast<size_t>(c->size());
    std::vector<size_t>& n = *counts;  // [send to each member | receive from each]
    bool equal = true;
    for (size_t q = 0; q < P; ++q) {
      n[q] = static_cast<size_t>(send_rows[q] * width);
      n[P + q] = static_cast<size_t>(recv_rows[q] * width);
      equal = equal && n[q] == n[0] && n[P + q] == n[0];
    }
    if (equal)
      c->alltoall(send, recv, n[0], collectives::DataType::kFloat32);
    else
      c->alltoallv(send, std::span<const size_t>(n.data(), P), recv, std::span<const size_t>(n.data() + P, P),
                   collectives::DataType::kFloat32);
    const int64_t t1 = now_us();
    add(t0, t1);
    if (trace != nullptr && trace->enabled())
      trace->span("expert alltoall", "comm", t0, t1, 0, fmt::format(R"({{"bytes":{}}})", 4 * width * send_rows[0]));
  };
  return e;
}

}  // namespace pwm::train
