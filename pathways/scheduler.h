// Island schedulers: the order in which runs reach the devices of one island.
//
// Every worker of an island runs the gang-scheduled nodes (kernels with collectives) of the runs
// it was sent in the order they arrived (worker.h), and the dispatcher sends a run to all of an
// island's workers in the order the island's scheduler releases it. So the scheduler decides the
// one order of the island, and programs with collectives on overlapping slices cannot deadlock.
// FIFO releases in submission order at once; later policies (proportional share across clients,
// back-pressure) hold runs back and release them in another order. A policy must release runs
// that span several islands in the same relative order on each of them.
//
// Used by the dispatcher thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>

namespace pwm::pathways {

struct RunTicket {
  uint64_t run_id = 0;
  uint64_t client = 0;
  int nodes = 0;  // gang-scheduled work units, for cost-aware policies
};

class IslandScheduler {
 public:
  virtual ~IslandScheduler() = default;
  virtual const char* name() const = 0;
  // A run that uses this island was submitted (in submission order).
  virtual void submit(const RunTicket& t) = 0;
  // The next run to send to the island's workers, if the policy releases one now.
  virtual std::optional<uint64_t> next() = 0;
  // A released run finished on every device (for policies that bound what is in flight).
  virtual void finished(uint64_t run_id) {}
};

class FifoScheduler : public IslandScheduler {
 public:
  const char* name() const override { return "fifo"; }
  void submit(const RunTicket& t) override { q_.push_back(t.run_id); }
  std::optional<uint64_t> next() override {
    if (q_.empty()) return std::nullopt;
    uint64_t r = q_.front();
    q_.pop_front();
    return r;
  }

 private:
  std::deque<uint64_t> q_;
};

using SchedulerFactory = std::function<std::unique_ptr<IslandScheduler>(int island)>;

}  // namespace pwm::pathways
