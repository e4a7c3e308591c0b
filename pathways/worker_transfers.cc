// A worker's bytes to and from other workers (a run's sends and receives, moves between
// programs) and the controller's fetches. The state: worker_impl.h.
#include <cstdlib>
#include <cstring>

#include "common/env.h"
#include "common/time.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"
#include "pathways/object_id.h"
#include "pathways/tags.h"
#include "pathways/worker_impl.h"

namespace pwm::pathways::worker_detail {

bool Worker::test_recv(Run& run, size_t i, size_t* got) {
  const dataflow::Instr& in = run.prog->p.instrs[i];
  std::string what;
  try {
    if (!t_->test(run.reqs[i], got)) return false;
    if (*got == in.bytes) return true;
    what = fmt::format("received {} bytes", *got);
  } catch (const std::exception& e) {
    what = fmt::format("got a longer message ({})", e.what());
  }
  t_->abort(fmt::format("pathways transfer mismatch: {} {} from world rank {}{} where {} bytes were expected "
                        "(transfer {} of run {}, program '{}'); aborting the job",
                        where_on_host(), what, in.peer, on_host(in.peer), in.bytes, in.xfer, run.h.run_id,
                        run.prog->p.name));
  std::abort();  // not reached
}

void Worker::done(Run& run, size_t i) {
  run.state[i] = kDone;
  run.left--;
  const dataflow::WorkerProgram& p = run.prog->p;
  const dataflow::Instr& in = p.instrs[i];
  if (in.op == dataflow::Op::kExec) {
    for (int32_t s : p.execs[in.exec].ins) read_done(run, s);
    run.execs_done++;
    while (run.next_exec < p.instrs.size() &&
           (p.instrs[run.next_exec].op != dataflow::Op::kExec || run.state[run.next_exec] == kDone))
      run.next_exec++;
  } else if (in.op == dataflow::Op::kSend || in.op == dataflow::Op::kCopy) {
    read_done(run, in.slot);
  }
  if (--run.stage_left[in.stage] == 0 && (run.h.flags & kRunSequential)) {
    chan_.send(0, StageDone{run.h.run_id, in.stage});
  }
  while (run.first < run.state.size() && run.state[run.first] == kDone) run.first++;
}

void Worker::post_send(Run& run, size_t i) {
  const dataflow::Instr& in = run.prog->p.instrs[i];
  note_posted(run, i);
  run.reqs[i] = t_->isend(static_cast<char*>(run.slots[in.slot]->buf.data()) + in.offset, in.bytes, in.peer,
                          tags::data_tag(run.h.xfer_base, in.xfer));
  run.state[i] = kPosted;
}

void Worker::post_recv(Run& run, size_t i) {
  const dataflow::Instr& in = run.prog->p.instrs[i];
  note_posted(run, i);
  run.reqs[i] = t_->irecv(static_cast<char*>(write_ptr(run, in.slot)) + in.offset, in.bytes, in.peer,
                          tags::data_tag(run.h.xfer_base, in.xfer));
  run.state[i] = kPosted;
}

bool Worker::progress_moves() {
  bool any = false;
  for (auto it = moves_.begin(); it != moves_.end();) {
    Move& m = *it;
    if (!m.posted) {
      if (m.out && !m.obj->resolved()) {
        ++it;
        continue;
      }
      m.req = m.out ? t_->isend(m.obj->buf.data(), m.obj->buf.size(), m.peer, m.tag)
                    : t_->irecv(m.obj->buf.data(), m.obj->buf.size(), m.peer, m.tag);
      m.posted = true;
      any = true;
    }
    if (t_->test(m.req, nullptr)) {
      if (m.out) {
        if (store_.find(m.object) == m.obj) store_.erase(m.object);
      } else {
        m.obj->write_done();
      }
      it = moves_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

bool Worker::progress_fetches() {
  bool any = false;
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    ObjectPtr obj = store_.find(it->object);
    if ((obj && !obj->resolved()) || (!obj && queued(run_of_object(it->object)))) {  // pending, or its run waits for memory
      ++it;
      continue;
    }
    FetchReply reply{it->request, "", {}};
    if (!obj)
      reply.error = fmt::format("object {} does not exist on {}", it->object, where());
    else if (obj->state == Object::State::kFailed)
      reply.error = obj->error;
    else
      reply.bytes = {static_cast<const uint8_t*>(obj->buf.data()), obj->buf.size()};
    chan_.send(0, reply);
    it = fetches_.erase(it);
    any = true;
  }
  return any;
}

}  // namespace pwm::pathways::worker_detail
