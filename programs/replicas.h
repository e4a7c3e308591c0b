// The replicas' step traced as a dataflow program (both MPMD models run it): cfg.mesh.replicas
// slices of dp x tp devices, one per replica, each computing its gradient pieces (fused:
// fused_grads or shard_grads; chained: the plan's units, trace.h), the pieces exchanged between
// the replicas' corresponding devices as program edges (each device 1/dp of a piece) and summed
// in replica order on every replica (replica_add), then replica_update. Nothing here blocks but
// `call`; no MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dataflow/builder.h"
#include "programs/step_io.h"
#include "programs/trace.h"
#include "train/modes.h"

namespace pwm::programs {

// `call` adds a node on replica r's slice r; `states`: each replica's state parameters. Returns
// each replica's StepOutputs, in replica order. --fsdp at chained: fsdp_held (optional) gets
// Grads::fsdp_held.
std::vector<dataflow::Value> trace_replica_step(const Shapes& sh, const KernelNames& names,
                                                pwm::train::Granularity granularity,
                                                const std::vector<State<dataflow::Value>>& states, const SliceCall& call,
                                                int64_t* fsdp_held = nullptr);
// "replicas-chained-R2".
std::string replica_name(pwm::train::Granularity granularity, int replicas);

}  // namespace pwm::programs
