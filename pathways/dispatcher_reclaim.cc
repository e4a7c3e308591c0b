// The dispatcher's part in reclaiming a context block retired after a loss (dispatcher.h,
// docs/pathways_liveness.md, "Reclaiming a context").
//
// A retired block may still hold messages of collectives abandoned on it, on their way or
// waiting unmatched at a member. Each live member counts, per context of the block and per
// world rank, the messages its collectives sent and received (Transport::traffic), and answers
// once no run of its own uses the block. With every answer in, what member m must still take
// from peer p is what p counts as sent to m minus what m counts as received from p: exact, so
// the drain (collectives::ContextDrain, on the worker) ends when the last message is in, with no
// guess of how long a message travels. A member that was lost reports nothing: its messages may
// stay unmatched at the others, which is safe for any later group without it (a receive names
// its sender), so the block returns barred for groups with it (ResourceManager::reclaim).
#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "pathways/dispatcher.h"

namespace pwm::pathways {

void Dispatcher::start_reclaims() {
  std::vector<ResourceManager::RetiredBlock> blocks = c_.rm().take_retired();
  for (const auto& b : blocks) {
    // After the shutdown nothing more is sent to the workers: the block stays retired.
    if (shutdown_sent_) continue;
    auto [it, fresh] = reclaims_.try_emplace(b.context);
    PWM_CHECK(fresh, "context {} retired twice", b.context);
    Reclaim& r = it->second;
    for (int d : b.devices) {
      const int rank = d + 1;
      if (lost_.count(rank))
        r.excluded.push_back(d);
      else
        r.members.push_back(rank);
    }
    unasked_++;
  }
  if (unasked_ == 0 || shutdown_sent_) return;
  std::vector<uint32_t> asked;
  for (auto& [block, r] : reclaims_)
    if (!r.asked && ask_counts(block)) asked.push_back(block);
  for (uint32_t block : asked) reclaim_step(block);
}

bool Dispatcher::ask_counts(uint32_t block) {
  // A run lowered onto the block before it was retired and not sent yet (held by a scheduler; a
  // plain drain lets it run on the old mapping) would use it after the counts: wait until it is
  // sent (or abandoned). One sent before is in its workers' queues ahead of count_context.
  for (auto& [id, rp] : runs_) {
    if (rp->sent) continue;
    for (const auto& [rank, wp] : rp->lp->workers)
      for (const dataflow::ExecInfo& e : wp.execs)
        if (e.context >= block && e.context < block + dataflow::kSliceContextStride) return false;
  }
  post_staged();  // (runs staged in this pass go first)
  Reclaim& r = reclaims_.at(block);
  for (int rank : r.members) chan_.send(rank, CountContext{block});
  r.asked = true;
  unasked_--;
  return true;
}

void Dispatcher::reclaim_answer(const Message& m) {
  const uint32_t block = m.type == MsgType::kContextCount ? decode<ContextCount>(m.body).context
                                                          : decode<ContextDrained>(m.body).context;
  auto it = reclaims_.find(block);
  if (it == reclaims_.end()) return;  // (one given up at the shutdown)
  Reclaim& r = it->second;
  PWM_CHECK(std::find(r.members.begin(), r.members.end(), m.peer) != r.members.end(),
            "{} for context {} from world rank {}, which is not a member", msg_type_name(m.type), block, m.peer);
  if (m.type == MsgType::kContextCount)
    r.counts[m.peer] = decode<ContextCount>(m.body);
  else
    r.draining.erase(m.peer);
  reclaim_step(block);
}

void Dispatcher::reclaim_lost(int rank) {
  std::vector<uint32_t> touched;
  for (auto& [block, r] : reclaims_) {
    auto at = std::find(r.members.begin(), r.members.end(), rank);
    if (at == r.members.end()) continue;
    r.members.erase(at);
    r.counts.erase(rank);
    r.excluded.push_back(rank - 1);
    if (r.drain_sent) {
      r.draining.erase(rank);
      // The members still draining were told to take messages from it that may never come.
      DrainContext give_up{block, {}, true};
      for (uint32_t k = 0; k < dataflow::kSliceContextStride; ++k) give_up.counts.push_back({block + k, rank, 0});
      for (int m : r.draining) chan_.send(m, give_up);
    }
    touched.push_back(block);
  }
  for (uint32_t block : touched) reclaim_step(block);
}

void Dispatcher::reclaim_step(uint32_t block) {
  auto it = reclaims_.find(block);
  if (it == reclaims_.end()) return;
  Reclaim& r = it->second;
  if (!r.asked) return;
  if (!r.drain_sent) {
    if (r.counts.size() < r.members.size()) return;
    // sent[(context, from, to)] and received[(context, at, from)], from the members' answers.
    std::map<std::tuple<uint32_t, int, int>, uint64_t> sent, received;
    for (const auto& [m, c] : r.counts)
      for (const ContextTraffic& t : c.traffic) {
        PWM_CHECK(t.context >= block && t.context < block + dataflow::kSliceContextStride,
                  "context_count for block {} from world rank {} names context {}", block, m, t.context);
        sent[{t.context, m, t.peer}] = t.sent;
        received[{t.context, m, t.peer}] = t.received;
      }
    for (int m : r.members) {
      DrainContext d{block, {}};
      for (int p : r.members)
        for (uint32_t k = 0; k < dataflow::kSliceContextStride; ++k) {
          const uint32_t c = block + k;
          auto s = sent.find({c, p, m});
          auto g = received.find({c, m, p});
          const uint64_t out = s == sent.end() ? 0 : s->second, in = g == received.end() ? 0 : g->second;
          PWM_CHECK(out >= in, "context {}: world rank {} received from world rank {} more than it sent ({} > {})", c, m, p, in, out);
          if (out > in) d.counts.push_back({c, p, out - in});
        }
      chan_.send(m, d);
      r.draining.insert(m);
    }
    r.drain_sent = true;
  }
  if (!r.draining.empty()) return;
  c_.rm().reclaim(block, r.excluded);
  reclaims_.erase(it);
}

}  // namespace pwm::pathways
