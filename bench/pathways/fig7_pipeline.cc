// Fig. 7: a pipeline of k stages over 1-device slices, one per worker, stage i on worker i mod
// W, each stage --stage-us of busy compute and an add (no collectives). Parallel dispatch
// releases every stage at once; sequential dispatch (the paper's baseline) goes node after node
// through the controller. Throughput = stages per second, best of --reps; one runtime session
// for the whole figure.
#include <fmt/format.h>

#include "bench/pathways/figures.h"
#include "common/time.h"

namespace pwm::pathways::bench {

void run_pipeline(const Bench& b, std::vector<Row>* rows) {
  if (b.opt.stages.empty()) return;
  const int W = b.workers;
  Runtime rt(b.transport, b.runtime_options());
  Client c = rt.client("dispatch_bench");
  std::vector<Slice> devs;
  for (int w = 0; w < W; ++w) devs.push_back(c.allocate(1));
  Array p0 = c.put(devs[0], dataflow::Sharding::kReplicated, {1}, std::vector<float>{0});
  for (int64_t k : b.opt.stages) {
    ProgramBuilder pb(fmt::format("pipeline_{}", k));
    Value v = pb.param_like(p0);
    for (int64_t i = 0; i < k; ++i) v = pb.call("bench_stage", devs[i % W], {v}, {b.opt.stage_us})[0];
    pb.output(v);
    Program p = pb.build();
    for (bool seq : {false, true}) {
      RunOptions o;
      o.sequential = seq;
      std::vector<double> times;
      int wrong = 0;
      for (int r = -1; r < b.opt.reps; ++r) {
        const double t0 = now_s();
        Array y = c.run(p, {p0}, o)[0];
        y.wait();
        if (r >= 0) times.push_back(now_s() - t0);
        wrong += count_wrong(y, static_cast<float>(k));
      }
      Row row{7, seq ? Mode::kSequential : Mode::kParallel, W, static_cast<int>(k), b.opt.stage_us,
              k / best(times), wrong, k / median(times)};
      row.round_per_s = round_rates(static_cast<double>(k), times);
      rows->push_back(row);
    }
  }
  rt.shutdown();
}

}  // namespace pwm::pathways::bench
