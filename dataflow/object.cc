#include "dataflow/object.h"

#include "common/check.h"

namespace pwm::dataflow {

Object::Object(TensorSpec s, uint32_t writers, bool lazy)
    : spec(std::move(s)), buf(spec.bytes(), lazy), state(writers ? State::kPending : State::kReady),
      pending_writes(writers) {}

void Object::write_done() {
  PWM_CHECK_GT(pending_writes, 0u);
  if (--pending_writes == 0 && state == State::kPending) state = State::kReady;
}

void Object::fail(const std::string& e) {
  if (state == State::kFailed) return;
  state = State::kFailed;
  error = e;
}

}  // namespace pwm::dataflow
