#include "tests/pathways/test_kernels.h"

#include <chrono>
#include <thread>

#include "collectives/communicator.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"

namespace pwm::pathways::testing {

namespace {

dataflow::ArgSpec f32(std::vector<int64_t> shape, dataflow::Sharding s) { return {{collectives::DataType::kFloat32, std::move(shape)}, s}; }

dataflow::Sharding sharding_attr(int64_t v) { return v == 0 ? dataflow::Sharding::kSplit : dataflow::Sharding::kReplicated; }

// Per-shard shape of a [rows, cols] logical tensor.
std::vector<int64_t> shard_shape(int64_t rows, int64_t cols, dataflow::Sharding s, int n) {
  if (s == dataflow::Sharding::kSplit) {
    if (rows % n != 0) PWM_THROW("{} rows do not split over {} devices", rows, n);
    return {rows / n, cols};
  }
  return {rows, cols};
}

void allreduce_add_once(dataflow::KernelContext& ctx, std::span<float> v, float c) {
  ctx.comm().allreduce(v, collectives::ReduceOp::kSum);
  for (auto& x : v) x += c;
}

}  // namespace

void register_test_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  auto& reg = dataflow::KernelRegistry::global();

  reg.add({"iota", false,
           [](std::span<const int64_t> a, int n) {
             dataflow::Signature s;
             s.outputs = {f32(shard_shape(a[0], a[1], dataflow::Sharding::kSplit, n), dataflow::Sharding::kSplit)};
             return s;
           },
           [](dataflow::KernelContext& ctx) {
             auto out = ctx.out<float>(0);
             const int64_t rows = ctx.output_spec(0).shape[0], cols = ctx.output_spec(0).shape[1];
             for (int64_t r = 0; r < rows; ++r)
               for (int64_t c = 0; c < cols; ++c)
                 out[r * cols + c] = static_cast<float>(1000 * (ctx.shard() * rows + r) + c);
           }});

  reg.add({"scale", false,
           [](std::span<const int64_t> a, int n) {
             dataflow::Sharding sh = sharding_attr(a[3]);
             dataflow::Signature s;
             s.inputs = {f32(shard_shape(a[1], a[2], sh, n), sh)};
             s.outputs = s.inputs;
             return s;
           },
           [](dataflow::KernelContext& ctx) {
             auto x = ctx.in<float>(0);
             auto y = ctx.out<float>(0);
             const float f = static_cast<float>(ctx.attr(0));
             for (size_t i = 0; i < x.size(); ++i) y[i] = f * x[i];
           }});

  reg.add({"add2", false,
           [](std::span<const int64_t> a, int n) {
             dataflow::Sharding sh = sharding_attr(a[2]);
             dataflow::Signature s;
             s.inputs = {f32(shard_shape(a[0], a[1], sh, n), sh), f32(shard_shape(a[0], a[1], sh, n), sh)};
             s.outputs = {s.inputs[0]};
             return s;
           },
           [](dataflow::KernelContext& ctx) {
             auto x = ctx.in<float>(0), y = ctx.in<float>(1);
             auto z = ctx.out<float>(0);
             for (size_t i = 0; i < x.size(); ++i) z[i] = x[i] + y[i];
           }});

  reg.add({"allreduce_add", true,
           [](std::span<const int64_t> a, int) {
             dataflow::Signature s;
             std::vector<int64_t> shape{a.size() > 1 ? a[1] : 1};
             if (a.size() > 2) shape.push_back(a[2]);
             s.inputs = {f32(shape, dataflow::Sharding::kReplicated)};
             s.outputs = s.inputs;
             return s;
           },
           [](dataflow::KernelContext& ctx) {
             auto x = ctx.in<float>(0);
             auto y = ctx.out<float>(0);
             std::copy(x.begin(), x.end(), y.begin());
             allreduce_add_once(ctx, y, static_cast<float>(ctx.attr(0)));
           }});

  reg.add({"chain_fused", true,
           [](std::span<const int64_t> a, int) {
             dataflow::Signature s;
             s.inputs = {f32({a[2]}, dataflow::Sharding::kReplicated)};
             s.outputs = s.inputs;
             return s;
           },
           [](dataflow::KernelContext& ctx) {
             auto x = ctx.in<float>(0);
             auto y = ctx.out<float>(0);
             std::copy(x.begin(), x.end(), y.begin());
             for (int64_t i = 0; i < ctx.attr(0); ++i) allreduce_add_once(ctx, y, static_cast<float>(ctx.attr(1)));
           }});

  reg.add("boom", {{f32({1}, dataflow::Sharding::kReplicated)}, {f32({1}, dataflow::Sharding::kReplicated)}},
          [](dataflow::KernelContext& ctx) {
            const int64_t who = ctx.attrs().empty() ? -1 : ctx.attr(0);
            if (who < 0 || who == ctx.shard()) PWM_THROW("boom on shard {}", ctx.shard());
            ctx.out<float>(0)[0] = ctx.in<float>(0)[0];
          });

  reg.add("sleep_allreduce", {{f32({1}, dataflow::Sharding::kReplicated)}, {f32({1}, dataflow::Sharding::kReplicated)}},
          [](dataflow::KernelContext& ctx) {
            std::this_thread::sleep_for(std::chrono::microseconds(ctx.attr(0)));
            ctx.out<float>(0)[0] = ctx.in<float>(0)[0];
            ctx.comm().allreduce(ctx.out<float>(0), collectives::ReduceOp::kSum);
          }, /*collectives=*/true);

  // What collectives left midway after a loss leave behind: every shard sends every other one
  // float (1000) on the tag of its slice communicator's first collective (docs/collectives.md,
  // "Matching": context c, sequence 0, data), counted as a collective's send; no receive here
  // takes them. In process only: the fabric's sends are complete when posted.
  reg.add("stray_message", {{f32({1}, dataflow::Sharding::kReplicated)}, {f32({1}, dataflow::Sharding::kReplicated)}},
          [](dataflow::KernelContext& ctx) {
            ctx.out<float>(0)[0] = ctx.in<float>(0)[0];
            collectives::Communicator& c = ctx.comm();
            static const float kStray = 1000;
            const uint32_t k = c.context();
            const int tag = collectives::logical_tag(static_cast<int>(k / 64), static_cast<int>((k % 64) << 9));
            collectives::Transport& t = c.transport();
            for (int j = 0; j < c.size(); ++j) {
              if (j == c.rank()) continue;
              collectives::Request r = t.isend(&kStray, sizeof kStray, c.group()[j], tag);
              PWM_CHECK(t.test(r, nullptr), "stray_message: an in-process send is complete when posted");
              t.count_message(k, c.group()[j], true);
            }
          }, /*collectives=*/true);

  reg.add("sleep_ms", {{f32({1}, dataflow::Sharding::kReplicated)}, {f32({1}, dataflow::Sharding::kReplicated)}},
          [](dataflow::KernelContext& ctx) {
            std::this_thread::sleep_for(std::chrono::milliseconds(ctx.attr(0)));
            ctx.out<float>(0)[0] = ctx.in<float>(0)[0];
          });
}

}  // namespace pwm::pathways::testing
