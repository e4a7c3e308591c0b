// The runtime's Perfetto trace (controller_trace.h).
#include "pathways/controller_trace.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/trace.h"

namespace pwm::pathways {

namespace {
std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      o += fmt::format("\\u{:04x}", static_cast<int>(ch));
    } else {
      o += ch;
    }
  }
  return o + "\"";
}
}  // namespace

void ControllerTrace::program(uint64_t lowered_id, const ProgramDef& def) {
  if (!enabled() || programs_.count(lowered_id)) return;
  std::vector<std::string> kernels;
  for (auto& n : def.nodes) kernels.push_back(n.kernel);
  programs_[lowered_id] = {def.name, std::move(kernels)};
}

void ControllerTrace::run(uint64_t run_id, uint64_t owner, const std::string& program, double t0, double t1,
                          double predicted) {
  if (enabled()) runs_.push_back({run_id, owner, program, t0, t1, predicted});
}

void ControllerTrace::device(int rank, const std::vector<TraceRecord>& records) {
  for (const TraceRecord& t : records) kernels_.push_back({rank, t});
}

void ControllerTrace::write(const std::map<uint64_t, std::string>& clients, const std::vector<int>& workers) const {
  double t0 = 1e300;
  for (auto& s : runs_) t0 = std::min(t0, s.t0);
  for (auto& [r, s] : kernels_) t0 = std::min(t0, s.t0);
  if (t0 == 1e300) t0 = 0;
  auto us = [&](double t) { return fmt::format("{:.3f}", (t - t0) * 1e6); };
  auto client = [&](uint64_t id) {
    auto it = clients.find(id);
    return it == clients.end() ? fmt::format("client {}", id) : it->second;
  };
  std::string out = "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"controller (rank 0)\"}}";
  for (auto& [id, n] : clients)
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":{}}}}}", id,
                       json_str("runs of " + n));
  for (int r : workers) {
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":\"device {} (rank {})\"}}}}",
                       r, r - 1, r);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"args\":{{\"sort_index\":{}}}}}", r, r);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"kernels\"}}}}", r);
  }
  for (auto& s : runs_)
    out += fmt::format(",\n{{\"ph\":\"X\",\"cat\":\"run\",\"name\":{},\"pid\":0,\"tid\":{},\"ts\":{},\"dur\":{:.3f},"
                       "\"args\":{{\"run\":{},\"client\":{},\"predicted_done_us\":{}}}}}",
                       json_str(client(s.owner)), s.owner, us(s.t0), (s.t1 - s.t0) * 1e6, s.run_id,
                       json_str(client(s.owner) + ": " + s.program), s.predicted > 0 ? us(s.predicted) : "null");
  for (auto& [r, s] : kernels_) {
    std::string program = "?", kernel = "?";
    if (auto it = programs_.find(s.program_id); it != programs_.end()) {
      program = it->second.first;
      if (s.node < it->second.second.size()) kernel = it->second.second[s.node];
    }
    out += fmt::format(",\n{{\"ph\":\"X\",\"cat\":\"node\",\"name\":{},\"pid\":{},\"tid\":0,\"ts\":{},\"dur\":{:.3f},"
                       "\"args\":{{\"client\":{},\"program\":{},\"node\":{},\"kernel\":{},\"shard\":{},\"run\":{}}}}}",
                       json_str(client(s.owner)), r, us(s.t0), (s.t1 - s.t0) * 1e6, json_str(client(s.owner)),
                       json_str(program), s.node, json_str(kernel), s.shard, s.run_id);
  }
  write_trace_file(path_, {out});
}

}  // namespace pwm::pathways
