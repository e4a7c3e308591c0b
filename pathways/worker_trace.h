// A worker's share of the runtime's Perfetto trace (controller_trace.h draws it): the kernel
// executions and the worker-to-worker transfers of runs sent with kRunRecord, kept here and sent
// to the controller in one kTrace message before bye. Worker thread only.
//
// A transfer is a span from its post to its completion, paired with the other side's span by the
// run and the transfer index (the controller draws a flow between them). The post time must be
// read before the isend/irecv call: a send can be delivered while its call runs (a rank
// preempted on a shared core), and a span must not begin after its data arrived.
#pragma once

#include "common/time.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/messages.h"

namespace pwm::pathways {

class WorkerTrace {
 public:
  static bool recording(const RunHeader& h) { return (h.flags & kRunRecord) != 0; }

  void kernel(const RunHeader& h, uint32_t node, int32_t shard, double t0, double t1) {
    TraceRecord t = of(h, node, t0, t1);
    t.shard = shard;
    records_.records.push_back(t);
  }
  // Transfer instruction `in` of run `h`, posted at `posted` (now_s()), completed now, having
  // moved `bytes` (a dropless block's used rows: less than in.bytes).
  void transfer(const RunHeader& h, const dataflow::Instr& in, uint64_t bytes, double posted, TraceKind kind) {
    TraceRecord t = of(h, in.stage, posted, now_s());
    t.peer = in.peer;
    t.xfer = in.xfer;
    t.bytes = bytes;
    t.kind = kind;
    records_.records.push_back(t);
  }
  bool empty() const { return records_.records.empty(); }
  const TraceRecords& message() const { return records_; }

 private:
  static TraceRecord of(const RunHeader& h, uint32_t node, double t0, double t1) {
    TraceRecord t;
    t.run_id = h.run_id;
    t.program_id = h.program_id;
    t.owner = h.owner;
    t.node = node;
    t.t0 = t0;
    t.t1 = t1;
    return t;
  }
  TraceRecords records_;
};

}  // namespace pwm::pathways
