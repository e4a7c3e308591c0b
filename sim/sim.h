// pwm::sim: a discrete-event simulator of one training step and of the dispatch benchmarks under
// both execution models (docs/simulator.md).
//
// The simulator never describes the workloads itself: the SPMD step's units and gradient ranges
// come from model::StepPlan, collectives from the schedules the collectives library builds
// (collectives/algorithms.h, the algorithm Algorithm::kAuto picks), Pathways programs from
// dataflow::lower(). It adds only time: a Profile (measured on a machine by
// mpi_scripts/sim_calibrate.sh) says how long kernels, messages and dispatch steps take, and a
// Cluster says how many hosts and devices there are and which links join them.
//
// Everything is single-threaded and deterministic: the same inputs give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pwm::sim {

// What a simulated step or chain runs as: spmd_train's loop, or pathways_train at a granularity.
enum class ExecMode { kSpmd, kFused, kChained, kOpByOp };
// "spmd" | "fused" | "chained" | "opbyop"; throws pwm::Error with one line otherwise.
ExecMode parse_exec_mode(std::string_view text);
const char* name(ExecMode m);

// Which MPMD trainer runs a program of nodes (fused, chained, the pipeline): pathways_train (a
// controller process beside the workers dispatches every step and fetches its result) or
// mpmd_train, the static model (every rank runs its own instruction list, no controller: no
// dispatch, no fetch, transfers between the ranks only). An axis apart from ExecMode: both run
// the same programs at the same granularities.
enum class MpmdModel { kPathways, kStatic };
// "pathways" | "static"; throws pwm::Error with one line otherwise.
MpmdModel parse_mpmd_model(std::string_view text);
const char* name(MpmdModel m);

// A link: a message of b bytes occupies the sender's port for b / bandwidth and arrives
// latency_us after that. overhead_us is the per-message software cost at the sender (the
// alpha that is CPU, not wire).
struct Link {
  double latency_us = 1.0;
  double gbytes_per_s = 1.0;  // GB/s = 1e3 bytes per us
  double overhead_us = 0.0;
  // The bandwidth measured at several message sizes (bytes, GB/s), sorted by bytes. A TCP link
  // through a rate shaper delivers less the longer a transfer lasts (tbf's bucket covers the
  // start of a burst, then TCP backs off at its queue): at 200 Mbit/s here, 24 MB/s for 32 KiB
  // messages, 19 MB/s at 512 KiB, 16 MB/s at 8 MiB, which no single latency + bandwidth fits.
  // Between two sizes the rate is interpolated linearly in log(bytes); outside, the nearest one.
  // Empty: gbytes_per_s at every size.
  std::vector<std::pair<double, double>> gbytes_per_s_by_bytes;
  // CPU time per byte a rank sends or receives over this link, taken from the cores the
  // kernels run on. Only where a cluster's hosts share one machine's cores (hosts_share_cores:
  // the emulated hosts of cluster.sh, whose veth, bridge and TCP run in the same kernel as the
  // ranks); a real host's network stack has cores of its own. 0: free.
  double cpu_ns_per_byte = 0.0;
  double wire_us(double bytes) const;
};

// What one machine was measured to do (sim_calibrate.sh writes it; JSON as in
// docs/simulator_calibration.md).
struct Profile {
  std::string machine;  // free text: where and when it was measured
  // Kernels, from the trainers' traces: microseconds per GFLOP of the forward and of the
  // backward span (FLOPs counted per unit of the step plan, sim/step.h), the optimizer per
  // parameter, and the rest of a step (batch sampling, norm, bookkeeping) as a constant.
  double fwd_us_per_gflop = 0, bwd_us_per_gflop = 0;
  double opt_us_per_param = 0, step_overhead_us = 0;
  // Per micro-batch beyond the first: what a micro-batch costs outside its forward and backward
  // spans (sampling its batch, the loss, the gradient accumulation's bookkeeping).
  double microbatch_overhead_us = 0;
  // The same rates measured at several micro-batch sizes (tokens a kernel processes): a kernel
  // of fewer tokens works on a smaller activation set (T x d_ff floats) that stays in the core's
  // cache, so its time is not proportional to its FLOPs. Sorted by tokens; rates between two
  // measured sizes are interpolated linearly in log(tokens), outside they are the nearest
  // measured one. Empty: fwd_us_per_gflop / bwd_us_per_gflop at every size.
  struct KernelRate {
    double tokens, fwd_us_per_gflop, bwd_us_per_gflop;
  };
  std::vector<KernelRate> rates;
  // The rates' width: what a kernel's time per GFLOP is at other model widths (d_model) than the
  // calibration model's, as a factor on `rates` (measured at the reference model's width against
  // the calibration's, same tokens; the larger matrices reach a higher share of the core's peak).
  // Sorted by d_model; the factor is interpolated linearly in log(d_model) and outside the
  // measured widths is the nearest one's (no extrapolation). Empty: 1 at every width.
  struct WidthScale {
    double d_model, fwd, bwd;
  };
  std::vector<WidthScale> width_scales;
  // The rates of a kernel of this many tokens in a model of this width (0: the calibration's).
  KernelRate rate_at(double tokens, double d_model = 0) const;
  // Contention: compute slowdown when `ranks` processes share this machine's cores (ranks -> factor).
  std::vector<std::pair<int, double>> contention;
  double reduce_ns_per_byte = 0.2;  // local reduction in a collective (gamma)
  Link intra, inter, inter_shaped;  // in-host, cross-host (unshaped), cross-host shaped DCN
  // Pathways controller and workers (microseconds).
  double call_us = 0;        // controller cost of one client call (OpByOp: one program per call)
  double node_us = 0;        // controller cost per node of a dispatched program
  double msg_us = 0;         // controller cost per worker message of a run
  double exec_us = 0;        // worker cost per kernel launch (beyond the kernel's own time)
  double spmd_exec_us = 0;   // a computation's cost beyond T + AllReduce in the SPMD loop
  double program_exec_us = 0;  // the same inside a dispatched program (the fused kernel's loop,
                               // a chained or OpByOp node): the same work, other code
  double fetch_rtt_us = 0;   // client fetch of a result: controller -> worker -> controller
  double step_kernel_us = 0; // fused Pathways step: its per-step cost beyond the SPMD step (dispatch,
                             // fetch round trip, the fused kernel's set-up)
  double node_step_us = 0;   // chained / opbyop / pipeline steps: the same for a program of nodes
  double train_node_us = 0;  // Pathways trainers: a worker's cost per node of a chained/opbyop/pipeline step
                             // (buffers, inputs, launch: measured from pathways_train, not dispatch_bench)
  double train_call_us = 0;  // pathways_train --granularity opbyop: the controller's cost of one
                             // training node's Client::call beyond call_us (its arguments, futures
                             // and result arrays; measured from pathways_train, not dispatch_bench)
  // The static model (mpmd_train). node_us, step_us: measured from its chained step at 1 and 2
  // micro-batches as train_node_us / node_step_us are from pathways_train's: the executor's cost
  // per node (its receives posted and waited for, the kernel's slots, pending sends tested) and
  // per step (the allgather of every device's statistics after the step, the run's set-up).
  // exec_us, run_us: dispatch_bench's static chain (the chained program run by the workers'
  // executors alone), per computation beyond T + the AllReduce and per run, as spmd_exec_us is
  // the SPMD loop's. Absent from profiles calibrated before mpmd_train was measured: simulating
  // the static model with such a profile is refused (static_costs()).
  struct StaticCosts {
    double node_us = 0, step_us = 0, exec_us = 0, run_us = 0;
  };
  std::optional<StaticCosts> mpmd_static;
  // mpmd_static, or pwm::Error with one line naming the fix (recalibrate).
  const StaticCosts& static_costs() const;

  double contention_factor(int ranks_on_machine) const;
  nlohmann::json to_json() const;
  static Profile from_json(const nlohmann::json& j);
  static Profile load(const std::string& path);  // throws pwm::Error with the path
};

// Where devices are and how they are joined. Link fields in the JSON are either objects
// {"latency_us", "gbytes_per_s", "overhead_us"} or the names "measured:intra",
// "measured:inter", "measured:inter_shaped" (the profile's links).
struct Cluster {
  std::string name;
  int hosts = 1;
  int devices_per_host = 1;
  Link intra, inter;
  double compute_scale = 1.0;   // kernel time = measured / compute_scale ("device_gflops": derived)
  double dispatch_scale = 1.0;  // controller and worker costs = measured / dispatch_scale
  int cores_per_host = 0;       // > 0: compute slows by the profile's contention when ranks share cores
  bool hosts_share_cores = false;
  bool has_controller_link = false;
  Link controller_link;  // controller <-> workers (the paper: DCN); default: inter (cross-host) or intra  // emulated hosts (cluster.sh): every host's ranks on one machine's cores
  int devices() const { return hosts * devices_per_host; }
  int host_of(int device) const { return device / devices_per_host; }
  const Link& link(int a, int b) const { return host_of(a) == host_of(b) ? intra : inter; }
  static Cluster from_json(const nlohmann::json& j, const Profile& p);
  static Cluster load(const std::string& path, const Profile& p);
  static Cluster local(const Profile& p, int devices);  // one host of the profile's machine
};

}  // namespace pwm::sim
