// The names pathways takes from the layer below it (dataflow/, docs/dataflow.md): the kernels,
// the program IR and its lowering, which the static model (static_mpmd/) shares. Every pathways
// file reaches them through this header, unqualified, as before they moved out.
#pragma once

#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"

namespace pwm::pathways {

using collectives::DataType;
using dataflow::ArgSpec;
using dataflow::ExecInfo;
using dataflow::Instr;
using dataflow::KernelContext;
using dataflow::KernelDef;
using dataflow::KernelFn;
using dataflow::KernelRegistry;
using dataflow::lower;
using dataflow::LoweredProgram;
using dataflow::NodeDef;
using dataflow::Op;
using dataflow::OutputPlacement;
using dataflow::ParamDef;
using dataflow::ProgramDef;
using dataflow::Sharding;
using dataflow::sharding_name;
using dataflow::Signature;
using dataflow::SignatureFn;
using dataflow::SliceLookup;
using dataflow::SliceMapping;
using dataflow::SlotBinding;
using dataflow::TensorSpec;
using dataflow::ValueId;
using dataflow::WorkerProgram;

}  // namespace pwm::pathways
