// The names pathways_train takes from the layer below it (programs/, docs/dataflow.md): the
// training kernels, the step's shapes and argument positions, and the step traced as a program,
// which the static model (static_mpmd/) shares.
#pragma once

#include "programs/kernels.h"
#include "programs/step_io.h"
#include "programs/trace.h"

namespace pwm::pathways::train {

using programs::copy_chunk;
using programs::DeviceSet;
using programs::ExpertIsland;
using programs::Grads;
using programs::KernelNames;
using programs::pipe_update_args;
using programs::PipelineShape;
using programs::Pos;
using programs::register_train_kernels;
using programs::rep_f32;
using programs::rep_f64;
using programs::rep_i64;
using programs::replica_chunk;
using programs::replica_update_args;
using programs::ReplicaAttrs;
using programs::RouteFn;
using programs::CallFn;
using programs::Shapes;
using programs::split_f32;
using programs::split_f64;
using programs::split_i32;
using programs::stage_layers;
using programs::StageLayers;
using programs::State;
using programs::StepOutputs;
using programs::StepStats;
using programs::trace_grads;
using programs::trace_step;
using programs::TrainingDevice;
using programs::update_args;
using programs::UpdateArgs;
using enum programs::StateArg;
using enum programs::HeadArg;
using enum programs::HeadOut;
using enum programs::BlockBwdArg;
using enum programs::BlockBwdOut;
using enum programs::EmbedBwdArg;

}  // namespace pwm::pathways::train
