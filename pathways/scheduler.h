// Island schedulers: the order in which runs reach the devices of one island.
//
// Every worker of an island runs the gang-scheduled nodes (kernels with collectives) of the runs
// it was sent in the order they arrived (worker.h), and the dispatcher sends each run to all of
// its workers in one step, in the order the runs are released. So the schedulers decide the one
// order of the island, and programs with collectives on overlapping slices cannot deadlock.
//
// Two policies (docs/pathways_tenancy.md, "Multi-tenancy"):
//  - FIFO: releases every run at once, in submission order (the paper's default).
//  - Proportional share: one queue per client; at most `max_inflight_nodes` gang node-shards of
//    released, unfinished runs per island; the next run released is the head of the backlogged
//    client with the smallest virtual time, which advances by the run's cost (node-shards) over
//    the client's weight (start-time fair queueing / stride scheduling). With weights 1:2:4:8
//    and clients that always have work queued, the clients get node-shards in the ratio
//    1:2:4:8, counted, whatever their programs' lengths. A client that was idle re-enters at
//    the current virtual time: it does not bank credit.
// A run that spans several islands is released by each of them independently and dispatched
// when the last one releases it; it does not count against a window (a run held by one island
// while holding another's window could otherwise wait for ever). The dispatch order is global,
// so every worker still sees one order.
//
// Used by the dispatcher thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace pwm::pathways {

struct RunTicket {
  uint64_t run_id = 0;
  uint64_t client = 0;
  int nodes = 0;        // gang-scheduled work units (node-shards on this island), the run's cost
  double weight = 1;    // the client's weight (ClientOptions::weight), > 0
  int islands = 1;      // islands the run touches
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
  // Runs submitted and not yet released (the dispatcher polls finely while some are held).
  virtual size_t held() const { return 0; }
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
  size_t held() const override { return q_.size(); }

 private:
  std::deque<uint64_t> q_;
};

class ProportionalShareScheduler : public IslandScheduler {
 public:
  explicit ProportionalShareScheduler(int max_inflight_nodes = 16) : window_(max_inflight_nodes) {}
  const char* name() const override { return "share"; }
  void submit(const RunTicket& t) override;
  std::optional<uint64_t> next() override;
  void finished(uint64_t run_id) override;
  size_t held() const override { return held_; }

 private:
  struct Queue {
    std::deque<RunTicket> runs;
    double vtime = 0;  // virtual time at which the client's head run starts
  };
  int window_;
  int inflight_ = 0;
  double vnow_ = 0;  // virtual time of the run released last
  size_t held_ = 0;
  std::map<uint64_t, Queue> clients_;
  std::map<uint64_t, int> released_;  // run id -> node-shards counted against the window
};

// Policies by name: "fifo" or "share" (optionally "share:N", N = max_inflight_nodes). Throws
// pwm::Error for an unknown name. An empty factory means FIFO.
using SchedulerFactory = std::function<std::unique_ptr<IslandScheduler>(int island)>;
SchedulerFactory scheduler_by_name(const std::string& policy);

}  // namespace pwm::pathways
