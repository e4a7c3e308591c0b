// A worker's bytes to and from other workers outside runs (moves between programs) and the
// controller's fetches; a run's own sends and receives are its walk's (dataflow/interpreter.h).
// The state: worker_impl.h.
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
