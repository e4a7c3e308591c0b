// trace.h's templates for dataflow::Value: the programs both MPMD models build.
#include "programs/trace_impl.h"

namespace pwm::programs {

using dataflow::Value;

template std::vector<Value> trace_step(const Shapes&, const KernelNames&, int, const State<Value>&, const CallFn<Value>&,
                                       const RouteFn<Value>&, int64_t*, const ExpertIsland<Value>*);
template Grads<Value> trace_grads(const Shapes&, const KernelNames&, int, const State<Value>&, const CallFn<Value>&, int,
                                  const RouteFn<Value>&, const ExpertIsland<Value>*);

}  // namespace pwm::programs
