// Issue 58: buffer donation (dataflow::Signature::reuse, Walk::donate). A kernel that can run in
// place takes the buffer of an input that dies at it when nothing outside the run holds that
// input, so an update of a state held by nobody else keeps one copy of it, not two (the MPMD
// trainers' step: mpmd/trainer.cc, donated_state). Through the static executor's walk on one
// in-process rank (the Pathways worker runs the same walk over its object store's values):
//  - donated (the caller's last reference moved in): the output is the input's buffer, one copy
//    live inside the kernel, the values updated;
//  - held by the caller, read again after the kernel, or a kernel that does not declare reuse:
//    a new buffer, two copies live, the input unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "collectives/inproc_transport.h"
#include "dataflow/buffer.h"
#include "dataflow/builder.h"
#include "dataflow/interpreter.h"
#include "static_mpmd/executor.h"

namespace pwm::static_mpmd {
namespace {

using dataflow::ArgSpec;
using dataflow::KernelContext;
using dataflow::Sharding;
using dataflow::TensorSpec;

constexpr int64_t kFloats = int64_t{1} << 20;  // 4 MiB: a buffer the cache keeps (>= 1 MiB)
constexpr size_t kBytes = sizeof(float) * kFloats;

ArgSpec rep(int64_t n) { return ArgSpec{TensorSpec{collectives::DataType::kFloat32, {n}}, Sharding::kReplicated}; }

int64_t g_live_in_kernel = 0;  // Buffer::live_bytes() inside the last update

// y[i] = 2 x[i] + 1, element by element (x read before y is written): may run in place.
void update(KernelContext& ctx) {
  g_live_in_kernel = dataflow::Buffer::live_bytes();
  auto x = ctx.in<float>(0);
  auto y = ctx.out<float>(0);
  for (int64_t i = 0; i < kFloats; ++i) y[i] = 2 * x[i] + 1;
}

void register_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  auto& reg = dataflow::KernelRegistry::global();
  dataflow::Signature in_place{{rep(kFloats)}, {rep(kFloats)}};
  in_place.reuse = {0};
  reg.add("donation_update", in_place, update);
  reg.add("donation_update_copy", dataflow::Signature{{rep(kFloats)}, {rep(kFloats)}}, update);
  reg.add("donation_sum", dataflow::Signature{{rep(kFloats)}, {rep(1)}}, [](KernelContext& ctx) {
    double s = 0;
    for (float v : ctx.in<float>(0)) s += v;
    ctx.out<float>(0)[0] = static_cast<float>(s);
  });
}

struct Result {
  Shards out;
  RunStats stats;
  const void* input_data;
};

// `kernel` on a parameter x[i] = i; with `read_after`, x is also summed after it. `donate`: the
// caller's reference is moved in; otherwise `*held` keeps it.
Result run(const std::string& kernel, bool donate, bool read_after, dataflow::ObjectPtr* held) {
  register_kernels();
  Result r;
  collectives::run_inproc(1, [&](int, std::shared_ptr<collectives::Transport> t) {
    dataflow::Builder b("donation");
    const dataflow::Value x = b.param(0, 1, rep(kFloats));
    b.output(b.call(kernel, 0, 1, {x})[0]);
    if (read_after) b.output(b.call("donation_sum", 0, 1, {x})[0]);
    const auto lookup = [](int s) { return dataflow::SliceMapping{{s}, 1, 0, 0}; };
    const dataflow::Plan plan(dataflow::lower(b.build(), 0, lookup).workers.at(0));
    auto obj = std::make_shared<dataflow::Object>(TensorSpec{collectives::DataType::kFloat32, {kFloats}});
    float* p = static_cast<float*>(obj->buf.data());
    for (int64_t i = 0; i < kFloats; ++i) p[i] = static_cast<float>(i);
    r.input_data = p;
    Shards in;
    in[0] = obj;
    if (donate) {
      obj.reset();
    } else {
      *held = obj;
    }
    Executor exec(t, 60, collectives::kFirstFreeChannel);
    r.out = exec.run(plan, std::move(in), &r.stats);
  });
  return r;
}

void expect_updated(const Result& r) {
  const float* y = static_cast<const float*>(r.out.at(0)->buf.data());
  for (int64_t i : {int64_t{0}, int64_t{1}, kFloats - 1}) EXPECT_EQ(y[i], 2.0f * static_cast<float>(i) + 1);
}

TEST(Donation, DonatedInputIsUpdatedInPlace) {
  const int64_t before = dataflow::Buffer::live_bytes();
  const Result r = run("donation_update", true, false, nullptr);
  EXPECT_EQ(r.out.at(0)->buf.data(), r.input_data);
  EXPECT_EQ(r.stats.donated_bytes, kBytes);
  EXPECT_EQ(g_live_in_kernel - before, static_cast<int64_t>(kBytes));  // one copy of the state, not two
  expect_updated(r);
}

TEST(Donation, HeldInputIsNotWritten) {
  dataflow::ObjectPtr held;
  const int64_t before = dataflow::Buffer::live_bytes();
  const Result r = run("donation_update", false, false, &held);
  EXPECT_NE(r.out.at(0)->buf.data(), r.input_data);
  EXPECT_EQ(r.stats.donated_bytes, 0u);
  EXPECT_EQ(g_live_in_kernel - before, static_cast<int64_t>(2 * kBytes));
  EXPECT_EQ(static_cast<const float*>(held->buf.data())[7], 7.0f);
  expect_updated(r);
}

TEST(Donation, InputReadLaterIsNotWritten) {
  const Result r = run("donation_update", true, true, nullptr);
  EXPECT_EQ(r.stats.donated_bytes, 0u);
  const double n = static_cast<double>(kFloats);
  EXPECT_NEAR(static_cast<const float*>(r.out.at(1)->buf.data())[0], n * (n - 1) / 2, n * (n - 1) / 2 * 1e-5);
  expect_updated(r);
}

TEST(Donation, KernelWithoutReuseCopies) {
  const Result r = run("donation_update_copy", true, false, nullptr);
  EXPECT_EQ(r.stats.donated_bytes, 0u);
  EXPECT_NE(r.out.at(0)->buf.data(), r.input_data);
  expect_updated(r);
}

}  // namespace
}  // namespace pwm::static_mpmd
