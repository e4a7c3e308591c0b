// Issue 58: a value whose writer declares the prefix its readers use (KernelContext::set_used,
// ArgSpec::prefix: a dropless block's rows) crosses with that prefix only. On 2 ranks under
// mpirun, through the static executor's walk (the Pathways worker runs the same one):
//  - a block of 1 MiB, 1/4 of it declared used, sent from rank 0 to a prefix reader on rank 1:
//    rank 0's run sends 256 KiB, and the reader's sum of the prefix is the writer's;
//  - the same block without a declaration crosses whole (1 MiB);
//  - a reader that needs every byte of a prefix value is refused when the program is lowered.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "collectives/mpi_transport.h"
#include "common/check.h"
#include "dataflow/builder.h"
#include "static_mpmd/executor.h"

using namespace pwm;
using dataflow::ArgSpec;
using dataflow::KernelContext;
using dataflow::Sharding;
using dataflow::TensorSpec;

namespace {

constexpr int64_t kFloats = 1 << 18, kUsed = kFloats / 4;

ArgSpec rep(int64_t n, bool prefix = false) {
  ArgSpec a{TensorSpec{collectives::DataType::kFloat32, {n}}, Sharding::kReplicated};
  a.prefix = prefix;
  return a;
}

// Element i = i + 1 in the used prefix, -1 beyond (written: a Buffer's writer writes all of it).
void fill(KernelContext& ctx, bool declare) {
  auto y = ctx.out<float>(0);
  for (int64_t i = 0; i < kFloats; ++i) y[i] = i < kUsed ? static_cast<float>(i + 1) : -1.f;
  if (declare) ctx.set_used(0, sizeof(float) * kFloats, {sizeof(float) * kUsed});
}

void register_kernels() {
  auto& reg = dataflow::KernelRegistry::global();
  reg.add("fill_used", dataflow::Signature{{}, {rep(kFloats, true)}}, [](KernelContext& ctx) { fill(ctx, true); });
  reg.add("fill_whole", dataflow::Signature{{}, {rep(kFloats, true)}}, [](KernelContext& ctx) { fill(ctx, false); });
  reg.add("sum_prefix", dataflow::Signature{{rep(kFloats, true)}, {rep(1)}}, [](KernelContext& ctx) {
    double s = 0;
    for (int64_t i = 0; i < kUsed; ++i) s += ctx.in<float>(0)[i];
    ctx.out<float>(0)[0] = static_cast<float>(s);
  });
  reg.add("sum_all", dataflow::Signature{{rep(kFloats)}, {rep(1)}}, [](KernelContext& ctx) {
    double s = 0;
    for (float x : ctx.in<float>(0)) s += x;
    ctx.out<float>(0)[0] = static_cast<float>(s);
  });
}

// fill on rank 0, the reader on rank 1: (bytes rank 0 sent, the reader's output on rank 1).
std::pair<uint64_t, float> cross(std::shared_ptr<collectives::Transport> t, const char* writer) {
  dataflow::Builder b(writer);
  auto x = b.call(writer, 0, 1, {});
  b.output(b.call("sum_prefix", 1, 1, x)[0]);
  const auto lookup = [](int s) { return dataflow::SliceMapping{{s}, 1 + static_cast<uint32_t>(s), 0, 0}; };
  dataflow::LoweredProgram lp = dataflow::lower(b.build(), 0, lookup);
  static_mpmd::Executor exec(t, 60, collectives::kFirstFreeChannel);
  static_mpmd::RunStats st;
  const static_mpmd::Shards out = exec.run(dataflow::Plan(lp.workers.at(t->rank())), {}, &st);
  const float sum = t->rank() == 1 ? static_cast<const float*>(out.at(0)->buf.data())[0] : 0.f;
  return {st.bytes_sent, sum};
}

}  // namespace

int main(int argc, char** argv) {
  collectives::MpiEnvironment env(&argc, &argv);
  return collectives::run_mpi_main(env, [&] {
    register_kernels();
    auto t = env.transport();
    PWM_CHECK(t->size() == 2, "run on 2 ranks (got {})", t->size());
    const float want = static_cast<float>(kUsed * (kUsed + 1) / 2);
    const auto [used_bytes, used_sum] = cross(t, "fill_used");
    const auto [whole_bytes, whole_sum] = cross(t, "fill_whole");
    if (t->rank() == 0) {
      PWM_CHECK_EQ(used_bytes, sizeof(float) * kUsed);
      PWM_CHECK_EQ(whole_bytes, sizeof(float) * kFloats);
    } else {
      PWM_CHECK_EQ(used_sum, want);
      PWM_CHECK_EQ(whole_sum, want);
    }
    std::string refused;
    try {
      dataflow::Builder b("needs-every-byte");
      b.output(b.call("sum_all", 1, 1, b.call("fill_used", 0, 1, {}))[0]);
      dataflow::lower(b.build(), 0, [](int s) { return dataflow::SliceMapping{{s}, 1 + static_cast<uint32_t>(s), 0, 0}; });
    } catch (const Error& e) {
      refused = e.what();
    }
    PWM_CHECK(refused.find("needs every byte") != std::string::npos, "not refused: '{}'", refused);
    if (t->rank() == 0)
      fmt::print("ok: {} bytes crossed of a {}-byte block declared {} used; {} undeclared; a whole reader refused: {}\n",
                 used_bytes, sizeof(float) * kFloats, sizeof(float) * kUsed, whole_bytes, refused);
    return 0;
  });
}
