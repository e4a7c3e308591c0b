#include "train/figures.h"

namespace pwm::train {

void RunFigures::for_each(const std::function<void(const char*, const Number&)>& number,
                          const std::function<void(const char*, const List&)>& list) const {
#define PWM_NUMBER(f) number(#f, f)
#define PWM_LIST(f) list(#f, f)
  PWM_NUMBER(recoveries);
  PWM_NUMBER(replicas_dropped);
  PWM_NUMBER(replicas_left);
  PWM_NUMBER(bubble);
  PWM_NUMBER(bubble_bound);
  PWM_NUMBER(peak_rss_bytes);
  PWM_NUMBER(state_bytes);
  PWM_NUMBER(controller_peak_rss_bytes);
  PWM_NUMBER(memory_estimate_bytes);
  PWM_NUMBER(memory_activations_bytes);
  PWM_NUMBER(memory_in_flight_bytes);
  PWM_NUMBER(memory_moe_bytes);
  PWM_NUMBER(memory_gathers_bytes);
  PWM_NUMBER(memory_runtime_bytes);
  PWM_NUMBER(messages_per_step);
  PWM_NUMBER(recv_wait_ms);
  PWM_NUMBER(stages);
  PWM_NUMBER(stage_dp);
  PWM_NUMBER(stage_tp);
  PWM_NUMBER(dcn_bytes_per_step);
  PWM_NUMBER(xchg_exposed_ms);
  PWM_NUMBER(xchg_tail_ms);
  PWM_LIST(recovery_s);
  PWM_LIST(recovery_steps_run_again);
  PWM_LIST(peak_resident_bytes_per_rank);
  PWM_LIST(peak_resident_bytes_per_device);
  PWM_LIST(state_bytes_per_rank);
  PWM_LIST(peak_store_bytes);
  PWM_LIST(peak_intermediate_bytes);
  PWM_LIST(stage_islands);
  PWM_LIST(stage_activations);
#undef PWM_NUMBER
#undef PWM_LIST
}

}  // namespace pwm::train
