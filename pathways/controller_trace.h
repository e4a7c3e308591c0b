// The runtime's Perfetto trace (RuntimeOptions::trace_path, PWM_PW_TRACE): the controller's
// spans of each run (dispatch to completion, with its prediction) and every kernel execution the
// workers recorded, written at shutdown as one Chrome-JSON file (common/trace.h's atomic write)
// that ui.perfetto.dev opens.
//
// Process 0 is the controller, one row per client; process d+1 is device d, one row on which
// each kernel is a slice named after its client, so every client has one colour on every device
// (the paper's Fig. 9); a second row per device shows its worker-to-worker transfers (post to
// completion), and a flow arrow joins each send to its receive on the other device. Rows are
// labelled with their hosts. A worker's timestamps are its now_s() minus its clock offset to the
// controller, measured at start-up (collectives::Transport::clock_offset_us), so rows from
// different hosts line up. Recording is an append; with tracing off every method but enabled()
// is a no-op. Dispatcher thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pathways/messages.h"
#include "dataflow/kernel.h"
#include "dataflow/lowering.h"
#include "dataflow/program.h"

namespace pwm::pathways {

class ControllerTrace {
 public:
  explicit ControllerTrace(std::string path) : path_(std::move(path)) {}
  bool enabled() const { return !path_.empty(); }

  // The names of a lowered program's nodes, for the device rows (once per lowered program).
  void program(uint64_t lowered_id, const dataflow::ProgramDef& def);
  // A run from its dispatch to its completion; `predicted`: its predicted completion (0: none).
  void run(uint64_t run_id, uint64_t owner, const std::string& program, double t0, double t1, double predicted);
  // The kernel executions and transfers a worker recorded (its kTrace message); its clock runs
  // `clock_offset_s` ahead of the controller's, give or take `clock_error_s` (both go into the
  // row's metadata: a flow between two hosts can appear up to the sum of their errors early).
  void device(int rank, const std::vector<TraceRecord>& records, double clock_offset_s, double clock_error_s);
  // The hosts of the controller and of the workers (index world rank - 1), for the row labels.
  void hosts(std::string controller, std::vector<std::string> workers);
  // Writes the trace; `clients`: names by client id; `workers`: world ranks. Throws pwm::Error
  // if the file cannot be written.
  void write(const std::map<uint64_t, std::string>& clients, const std::vector<int>& workers) const;

 private:
  struct RunSpan {
    uint64_t run_id, owner;
    std::string program;
    double t0, t1, predicted;
  };
  std::string path_;
  std::vector<RunSpan> runs_;
  std::vector<std::pair<int, TraceRecord>> kernels_;  // by world rank, on the controller's clock
  std::map<int, std::pair<double, double>> clocks_;  // by world rank: offset, error (s)
  std::string controller_host_;
  std::vector<std::string> worker_hosts_;
  std::map<uint64_t, std::pair<std::string, std::vector<std::string>>> programs_;  // program, kernel per node
};

}  // namespace pwm::pathways
