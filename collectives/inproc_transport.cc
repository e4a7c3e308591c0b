#include "collectives/inproc_transport.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <list>
#include <thread>
#include <unordered_map>

namespace pwm::collectives {

namespace {

// One posted receive or one completed request's result.
struct Slot {
  std::atomic<bool> done{false};
  size_t received = 0;
  bool truncated = false;
  void* buf = nullptr;
  size_t bytes = 0;
  int src = 0;
  int tag = 0;
};

}  // namespace

struct InProcFabric::Mailbox {
  std::mutex mu;
  struct Message {
    int src, tag;
    std::vector<char> data;
  };
  std::list<Message> unexpected;      // sends that arrived before their receive
  std::list<std::shared_ptr<Slot>> posted;  // receives posted before their send
};

namespace {

class InProcTransport : public Transport {
 public:
  InProcTransport(InProcFabric* fabric, std::vector<InProcFabric::Mailbox*> boxes, int rank)
      : fabric_(fabric), boxes_(std::move(boxes)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(boxes_.size()); }
  std::string name() const override { return "inproc"; }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override {
    PWM_CHECK(peer >= 0 && peer < size(), "send to rank {} of {}", peer, size());
    check_tag(tag);
    auto* box = boxes_[peer];
    std::lock_guard<std::mutex> lock(box->mu);
    for (auto it = box->posted.begin(); it != box->posted.end(); ++it) {
      Slot& s = **it;
      if (s.src == rank_ && s.tag == tag) {
        s.received = bytes;
        s.truncated = bytes > s.bytes;
        if (!s.truncated && bytes > 0) std::memcpy(s.buf, buf, bytes);
        s.done.store(true, std::memory_order_release);
        box->posted.erase(it);
        return complete();
      }
    }
    InProcFabric::Mailbox::Message m{rank_, tag, std::vector<char>(bytes)};
    if (bytes > 0) std::memcpy(m.data.data(), buf, bytes);
    box->unexpected.push_back(std::move(m));
    return complete();
  }

  Request irecv(void* buf, size_t bytes, int peer, int tag) override {
    PWM_CHECK(peer >= 0 && peer < size(), "receive from rank {} of {}", peer, size());
    check_tag(tag);
    auto slot = std::make_shared<Slot>();
    slot->buf = buf;
    slot->bytes = bytes;
    slot->src = peer;
    slot->tag = tag;
    auto* box = boxes_[rank_];
    {
      std::lock_guard<std::mutex> lock(box->mu);
      bool matched = false;
      for (auto it = box->unexpected.begin(); it != box->unexpected.end(); ++it) {
        if (it->src == peer && it->tag == tag) {
          slot->received = it->data.size();
          slot->truncated = it->data.size() > bytes;
          if (!slot->truncated && !it->data.empty()) std::memcpy(buf, it->data.data(), it->data.size());
          slot->done.store(true, std::memory_order_release);
          box->unexpected.erase(it);
          matched = true;
          break;
        }
      }
      if (!matched) box->posted.push_back(slot);
    }
    uint64_t id = next_id_++;
    slots_[id] = slot;
    return Request{id};
  }

  bool test(Request& r, size_t* received) override {
    if (r.handle == 0) {  // a send: eager, complete at once
      if (received) *received = 0;
      return true;
    }
    auto it = slots_.find(r.handle);
    PWM_CHECK(it != slots_.end(), "unknown request {}", r.handle);
    Slot& s = *it->second;
    if (!s.done.load(std::memory_order_acquire)) return false;
    size_t got = s.received;
    bool trunc = s.truncated;
    int src = s.src;
    size_t want = s.bytes;
    slots_.erase(it);
    if (trunc)
      PWM_THROW("inproc transport: message of {} bytes from rank {} is longer than the {}-byte receive",
                got, src, want);
    if (received) *received = got;
    return true;
  }

  bool cancel_recv(Request& r, bool* received) override {
    if (received) *received = false;
    if (r.handle == 0) return true;
    auto it = slots_.find(r.handle);
    if (it == slots_.end()) return true;
    auto* box = boxes_[rank_];
    {
      std::lock_guard<std::mutex> lock(box->mu);  // (a send that matches it takes this lock too)
      box->posted.remove(it->second);
      if (received) *received = it->second->done.load(std::memory_order_acquire);
    }
    slots_.erase(it);  // withdrawn, or complete: either way over
    r.handle = 0;
    return true;
  }

  bool take_message(int peer, int tag) override {
    auto* box = boxes_[rank_];
    std::lock_guard<std::mutex> lock(box->mu);
    for (auto it = box->unexpected.begin(); it != box->unexpected.end(); ++it)
      if (it->src == peer && it->tag == tag) {
        box->unexpected.erase(it);  // (its bytes were copied at the send: nothing to keep)
        return true;
      }
    return false;
  }

  void idle() override { std::this_thread::yield(); }

  [[noreturn]] void abort(const std::string& message) override { throw CollectiveTimeout(message); }

 private:
  static Request complete() { return Request{0}; }
  // The MPI transport's bounds (transport.h), so that a tag layout that overflows them fails here
  // too.
  static void check_tag(int tag) {
    PWM_CHECK(tag >= 0 && tag <= kLogicalTagLimit - 1, "logical tag {} outside [0, {}) (collectives/transport.h)",
              tag, kLogicalTagLimit);
  }

  InProcFabric* fabric_;
  std::vector<InProcFabric::Mailbox*> boxes_;
  int rank_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<Slot>> slots_;
};

}  // namespace

InProcFabric::InProcFabric(int world_size) : size_(world_size) {
  PWM_CHECK_GT(world_size, 0);
  for (int i = 0; i < world_size; ++i) boxes_.push_back(std::make_unique<Mailbox>());
}

InProcFabric::~InProcFabric() = default;

std::shared_ptr<Transport> InProcFabric::transport(int rank) {
  PWM_CHECK(rank >= 0 && rank < size_, "rank {} of {}", rank, size_);
  std::vector<Mailbox*> boxes;
  for (auto& b : boxes_) boxes.push_back(b.get());
  return std::make_shared<InProcTransport>(this, std::move(boxes), rank);
}

void run_inproc(int n, const std::function<void(int, std::shared_ptr<Transport>)>& fn) {
  InProcFabric fabric(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, fabric.transport(r));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace pwm::collectives
