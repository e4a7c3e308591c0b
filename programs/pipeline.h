// The pipeline's step traced as a dataflow program (both MPMD models run it): cfg.mesh.replicas
// pipelines of S = sh.pipe().stages stages, replica r's stage s on slice r S + s (a dp x tp slice
// holding stage_layers(sh, s)), the units of every micro-batch in the schedule's order (GPipe or
// 1F1B), activations and their gradients flowing stage to stage as program edges. Each stage's
// layer pieces are summed over its dp group as soon as they are final (dp_reduce_start/_finish,
// or the blocking dp_allreduce with cfg.exec.overlap off), then over the replicas (replica_add,
// replica order); every stage applies pipe_update.
//
// The node order is the schedule: one global order that respects the dependencies, one op per
// stage per round, so that a consumer follows its producer closely. Pathways' workers run their
// nodes in it (RunOptions::in_order); the static model's ranks run their instruction lists in it.
// Nothing here blocks but `call`; no MPI.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dataflow/builder.h"
#include "programs/step_io.h"
#include "programs/trace.h"
#include "train/modes.h"

namespace pwm::programs {

// `call` adds a node on slice r S + s (SliceCall, trace.h). `states`: every slice's state
// parameters, in slice order. Returns each slice's StepOutputs, in
// slice order (the program's outputs).
std::vector<dataflow::Value> trace_pipeline_step(const Shapes& sh, const KernelNames& names, pwm::train::Schedule schedule,
                                                 const std::vector<State<dataflow::Value>>& states, const SliceCall& call);
// Per stage, the most micro-batches whose activations the schedule's order keeps at once on it
// (forwards run whose backward has not): GPipe M on every stage, 1F1B min(S - s, M).
std::vector<int> stage_activations(pwm::train::Schedule schedule, int stages, int64_t microbatches);
// "pipeline-1f1b-S2-M8" ("-R2" with replicas).
std::string pipeline_name(const Shapes& sh, pwm::train::Schedule schedule);

}  // namespace pwm::programs
