// The figures a trainer adds to its final report beyond the common ones (tokens/s, MFU, losses,
// hash: train/report.h), declared once, with their key in the metrics' last line and in the
// printed summary. Each is written only when set. The Python reports (mpi_scripts/*_report.py)
// read them by these keys; adding one here is the whole of declaring it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pwm::train {

struct RunFigures {
  using Number = std::optional<double>;
  using List = std::optional<std::vector<double>>;

  // Memory, measured after the last step, before the final evaluation and checkpoint.
  Number peak_rss_bytes;                // the largest peak resident set of a compute rank
  Number state_bytes;                   // the model state a device holds (16 B a parameter, + gathers)
  Number memory_estimate_bytes;         // train/checks.h estimate_memory: what the pre-run check counted
  Number memory_activations_bytes;      // ... its parts beside the state: a micro-batch's activations and scratch
  Number memory_in_flight_bytes;        //     a pipeline's further micro-batches
  Number memory_moe_bytes;              //     the MoE rows
  Number memory_gathers_bytes;          //     --fsdp's gathered layers
  Number memory_runtime_bytes;          //     the MPMD runtimes' intermediates
  List peak_resident_bytes_per_rank;    // spmd_train, index = rank
  List peak_resident_bytes_per_device;  // MPMD, index = device (pathways_train: rank d + 1; mpmd_train: rank d)
  Number controller_peak_rss_bytes;     // pathways_train: the controller's (rank 0's) own
  List state_bytes_per_rank;            // spmd_train, index = rank
  List peak_store_bytes;                // pathways_train, per slice: the workers' object-store high-water mark
  List peak_intermediate_bytes;         // MPMD, per slice: a step's intermediates alive at once
  // The static order (mpmd_train).
  Number messages_per_step;             // point-to-point sends of the busiest rank
  Number recv_wait_ms;                  // the slowest rank's median wait for receives before kernels
  // A pipeline (--stages).
  Number bubble;                        // median over steps: 1 - busy / step time, over every device
  Number bubble_bound;                  // (S - 1) / (M + S - 1)
  Number stages, stage_dp, stage_tp;
  List stage_islands;                   // per slice (replica-major)
  List stage_activations;               // per stage: micro-batches' activations the schedule holds at once
  // Replicas (--replicas).
  Number dcn_bytes_per_step;            // bytes between replicas per step
  Number xchg_exposed_ms;               // median: the exchange's time not hidden behind the backward
  Number xchg_tail_ms;                  // median: from the last backward kernel to the exchange's end
  // In-job recovery (pathways_train --spare-workers).
  Number recoveries;
  List recovery_s;                      // per recovery: its seconds
  List recovery_steps_run_again;        // per recovery: steps replayed and in flight run again
  Number replicas_dropped, replicas_left;

  // Every figure with its key, in the order they are written: the numbers, then the lists.
  void for_each(const std::function<void(const char* key, const Number&)>& number,
                const std::function<void(const char* key, const List&)>& list) const;
};

}  // namespace pwm::train
