#include "collectives/transport.h"

#include <algorithm>
#include <exception>

namespace pwm::collectives {

namespace {
thread_local void* t_scope = nullptr;  // the innermost BufferOwnerScope's State
}  // namespace

BufferOwnerScope::BufferOwnerScope(std::shared_ptr<const void> owner)
    : state_{std::move(owner), {}}, previous_(static_cast<State*>(t_scope)) {
  t_scope = &state_;
}
BufferOwnerScope::BufferOwnerScope(Make make)
    : state_{{}, std::move(make)}, previous_(static_cast<State*>(t_scope)) {
  t_scope = &state_;
}
BufferOwnerScope::~BufferOwnerScope() { t_scope = previous_; }
std::shared_ptr<const void> BufferOwnerScope::current() {
  auto* s = static_cast<State*>(t_scope);
  if (!s) return {};
  if (!s->owner && s->make) s->owner = s->make();
  return s->owner;
}

void Transport::abandon(Request& r, std::shared_ptr<const void> owner) {
  abandoned_.push_back({r, std::move(owner)});
  r = Request{};
}

size_t Transport::reap_abandoned() {
  std::erase_if(abandoned_, [&](Kept& k) {
    try {
      return test(k.req, nullptr);
    } catch (const std::exception&) {
      return true;  // (a failed request is over: MPI freed it, and is done with its buffer)
    }
  });
  return abandoned_.size();
}

Transport::Traffic Transport::traffic(uint32_t context) const {
  auto it = traffic_.find(context);
  return it == traffic_.end() ? Traffic{} : it->second;
}

void Transport::count_message(uint32_t context, int peer, bool sent) {
  Traffic& t = traffic_[context];
  if (t.sent.empty()) t.sent.assign(static_cast<size_t>(size()), 0), t.received.assign(static_cast<size_t>(size()), 0);
  (sent ? t.sent : t.received)[static_cast<size_t>(peer)]++;
}

void Transport::leak_abandoned() {
  // Still kept: sends no receiver will take (their peer was lost or left). They are freed so
  // that nothing is left pending when MPI ends, and their buffers are never freed: MPI may
  // still read them until it ends (abandon). Bounded by the losses of the run.
  static auto* leaked = new std::vector<std::shared_ptr<const void>>();
  for (Kept& k : abandoned_) {
    free_request(k.req);
    leaked->push_back(std::move(k.owner));
  }
  abandoned_.clear();
}

}  // namespace pwm::collectives
