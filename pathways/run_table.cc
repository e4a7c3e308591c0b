// The run table (run_table.h) and what a run says about itself.
#include "pathways/run_table.h"

#include <fmt/format.h>

#include <algorithm>

namespace pwm::pathways {

bool RunRec::awaited() const {
  if (opts.sequential || deadline > 0) return true;
  for (auto& a : out)
    if (a->awaited) return true;
  return false;
}

// Built from the workers' node events (started, finished) of a run sent with kRunTrace, and
// the lowered program (which node each rank runs, and where its inputs come from).
std::string RunRec::missed_deadline(double now) const {
  std::string msg = fmt::format("run {} of program '{}' missed its deadline of {:.2f} s:", id, prog->def.name,
                                opts.deadline_s);
  const auto& def = prog->def;
  for (int rank : waiting) {
    std::string where = fmt::format("device {} (world rank {})", rank - 1, rank);
    bool said = false;
    for (auto& [key, t0] : running) {
      if (key.first != rank) continue;
      const auto& nr = lp->node_ranks[key.second];
      int shard = static_cast<int>(std::find(nr.begin(), nr.end(), rank) - nr.begin());
      msg += fmt::format(" {} is stuck in {} (shard {} of {}), running for {:.2f} s;", where,
                         def.describe_node(key.second), shard, nr.size(), now - t0);
      said = true;
    }
    if (said) continue;
    for (uint32_t n = 0; n < lp->node_ranks.size() && !said; ++n) {
      const auto& nr = lp->node_ranks[n];
      if (std::find(nr.begin(), nr.end(), rank) == nr.end() || finished.count({rank, n})) continue;
      std::string why = lp->describe_wait(rank, n);
      msg += fmt::format(" {} is waiting to start {}{};", where, def.describe_node(n), why.empty() ? "" : " (" + why + ")");
      said = true;
    }
    if (!said) msg += fmt::format(" {} has not finished its transfers;", where);
  }
  msg.pop_back();
  return msg;
}

RunRec& RunTable::add(std::unique_ptr<RunRec> r) {
  RunRec& rr = *r;
  runs_[rr.id] = std::move(r);
  return rr;
}

std::unique_ptr<RunRec> RunTable::remove(uint64_t id) {
  auto it = runs_.find(id);
  if (it == runs_.end()) return nullptr;
  auto r = std::move(it->second);
  runs_.erase(it);
  return r;
}

void RunTable::prune_sent() {
  while (!sent_order_.empty()) {
    auto it = runs_.find(sent_order_.front());
    if (it != runs_.end() && !it->second->workers_done) break;
    sent_order_.pop_front();
  }
}

}  // namespace pwm::pathways
