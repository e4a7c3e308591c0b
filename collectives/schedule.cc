#include "collectives/schedule.h"

#include "common/check.h"

namespace pwm::collectives {

std::vector<std::byte> ScratchPool::take(size_t bytes) {
  // Best fit among the free buffers: the smallest one that is large enough.
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i].size() >= bytes && (best == free_.size() || free_[i].size() < free_[best].size()))
      best = i;
  if (best == free_.size()) return std::vector<std::byte>(bytes);
  std::vector<std::byte> out = std::move(free_[best]);
  free_.erase(free_.begin() + static_cast<long>(best));
  return out;
}

void ScratchPool::give(std::vector<std::byte>&& buf) {
  if (buf.empty()) return;
  free_.push_back(std::move(buf));
  if (free_.size() > 8) free_.erase(free_.begin());  // bound what idle communicators hold
}

Schedule::Schedule(DataType dtype, ReduceOp op, std::shared_ptr<ScratchPool> pool)
    : dtype_(dtype), op_(op), elem_(dtype_size(dtype)), pool_(std::move(pool)) {}

Schedule::~Schedule() {
  if (pool_)
    for (auto& s : scratch_) pool_->give(std::move(s));
}

Schedule::Id Schedule::add(Step s, const Deps& deps) {
  Id id = static_cast<Id>(steps_.size());
  s.dep_begin = static_cast<uint32_t>(deps_.size());
  for (Id d : deps) {
    if (d == kNone) continue;
    PWM_CHECK_LT(d, id);
    deps_.push_back(d);
  }
  s.dep_end = static_cast<uint32_t>(deps_.size());
  steps_.push_back(s);
  return id;
}

Schedule::Id Schedule::send(int peer, const void* src, size_t count, const Deps& deps) {
  return add(Step{StepKind::kSend, peer, nullptr, src, nullptr, count}, deps);
}

Schedule::Id Schedule::recv(int peer, void* dst, size_t count, const Deps& deps) {
  return add(Step{StepKind::kRecv, peer, dst, nullptr, nullptr, count}, deps);
}

Schedule::Id Schedule::reduce(void* dst, const void* a, const void* b, size_t count,
                              const Deps& deps) {
  return add(Step{StepKind::kReduce, -1, dst, a, b, count}, deps);
}

Schedule::Id Schedule::copy(void* dst, const void* src, size_t count, const Deps& deps) {
  return add(Step{StepKind::kCopy, -1, dst, src, nullptr, count}, deps);
}

void* Schedule::scratch(size_t count) {
  size_t bytes = std::max<size_t>(count * elem_, 1);
  std::vector<std::byte> buf = pool_ ? pool_->take(bytes) : std::vector<std::byte>(bytes);
  scratch_.push_back(std::move(buf));
  return scratch_.back().data();
}

}  // namespace pwm::collectives
