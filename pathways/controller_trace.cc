// The runtime's Perfetto trace (controller_trace.h).
#include "pathways/controller_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

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

void ControllerTrace::program(uint64_t lowered_id, const dataflow::ProgramDef& def) {
  if (!enabled() || programs_.count(lowered_id)) return;
  std::vector<std::string> kernels;
  for (auto& n : def.nodes) kernels.push_back(n.kernel);
  programs_[lowered_id] = {def.name, std::move(kernels)};
}

void ControllerTrace::run(uint64_t run_id, uint64_t owner, const std::string& program, double t0, double t1,
                          double predicted) {
  if (enabled()) runs_.push_back({run_id, owner, program, t0, t1, predicted});
}

void ControllerTrace::device(int rank, const std::vector<TraceRecord>& records, double clock_offset_s,
                             double clock_error_s) {
  clocks_[rank] = {clock_offset_s, clock_error_s};
  for (TraceRecord t : records) {
    t.t0 -= clock_offset_s;
    t.t1 -= clock_offset_s;
    kernels_.push_back({rank, t});
  }
}

void ControllerTrace::hosts(std::string controller, std::vector<std::string> workers) {
  controller_host_ = std::move(controller);
  worker_hosts_ = std::move(workers);
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
  auto on = [](const std::string& host) { return host.empty() ? std::string() : " on " + host; };
  std::string out = fmt::format("{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{{\"name\":{}}}}}",
                                json_str("controller (rank 0)" + on(controller_host_)));
  for (auto& [id, n] : clients)
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":{}}}}}", id,
                       json_str("runs of " + n));
  for (int r : workers) {
    const std::string host = r >= 1 && static_cast<size_t>(r - 1) < worker_hosts_.size() ? worker_hosts_[r - 1] : "";
    const auto clock = clocks_.count(r) ? clocks_.at(r) : std::pair<double, double>{0, 0};
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":{},"
                       "\"clock_offset_us\":{:.0f},\"clock_error_us\":{:.0f}}}}}",
                       r, json_str(fmt::format("device {} (rank {}){}", r - 1, r, on(host))), clock.first * 1e6,
                       clock.second * 1e6);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":1,\"args\":{{\"name\":\"transfers\"}}}}", r);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"args\":{{\"sort_index\":{}}}}}", r, r);
    out += fmt::format(",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"kernels\"}}}}", r);
  }
  for (auto& s : runs_)
    out += fmt::format(",\n{{\"ph\":\"X\",\"cat\":\"run\",\"name\":{},\"pid\":0,\"tid\":{},\"ts\":{},\"dur\":{:.3f},"
                       "\"args\":{{\"run\":{},\"client\":{},\"predicted_done_us\":{}}}}}",
                       json_str(client(s.owner)), s.owner, us(s.t0), (s.t1 - s.t0) * 1e6, s.run_id,
                       json_str(client(s.owner) + ": " + s.program), s.predicted > 0 ? us(s.predicted) : "null");
  // Transfers: a span per side on the device's second row, and a flow from each send to the
  // receive of the same run and transfer index (placed just inside both spans, where Perfetto
  // binds a flow to its enclosing slice).
  std::map<std::pair<uint64_t, uint32_t>, std::pair<int, TraceRecord>> sends;
  for (auto& [r, s] : kernels_)
    if (s.kind == kTraceSend) sends[{s.run_id, s.xfer}] = {r, s};
  uint64_t flow = 0;
  for (auto& [r, s] : kernels_) {
    if (s.kind == kTraceKernel) continue;
    const bool send = s.kind == kTraceSend;
    out += fmt::format(",\n{{\"ph\":\"X\",\"cat\":\"transfer\",\"name\":{},\"pid\":{},\"tid\":1,\"ts\":{},\"dur\":{:.3f},"
                       "\"args\":{{\"run\":{},\"transfer\":{},\"bytes\":{},\"client\":{}}}}}",
                       json_str(fmt::format("{} x{} {} rank {}", send ? "send" : "recv", s.xfer, send ? "to" : "from", s.peer)),
                       r, us(s.t0), (s.t1 - s.t0) * 1e6, s.run_id, s.xfer, s.bytes, json_str(client(s.owner)));
    if (send) continue;
    auto it = sends.find({s.run_id, s.xfer});
    if (it == sends.end() || it->second.first != s.peer) continue;
    const TraceRecord& from = it->second.second;
    // 1 ns inside each span (the file's resolution): a transfer within one host can take less
    // than two microseconds from the send's post to the receive's completion.
    const double in_send = std::min(1e-9, (from.t1 - from.t0) / 2), in_recv = std::min(1e-9, (s.t1 - s.t0) / 2);
    ++flow;
    out += fmt::format(",\n{{\"ph\":\"s\",\"cat\":\"transfer\",\"name\":\"transfer\",\"id\":{},\"pid\":{},\"tid\":1,\"ts\":{}}}",
                       flow, s.peer, us(from.t0 + in_send));
    out += fmt::format(",\n{{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"transfer\",\"name\":\"transfer\",\"id\":{},\"pid\":{},"
                       "\"tid\":1,\"ts\":{}}}", flow, r, us(s.t1 - in_recv));
  }
  for (auto& [r, s] : kernels_) {
    if (s.kind != kTraceKernel) continue;
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
