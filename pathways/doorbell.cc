// The dispatcher's doorbell (doorbell.h).
#include "pathways/doorbell.h"

#include "common/time.h"

namespace pwm::pathways {

bool Doorbell::devices_busy_past_wake() const {
  return sleeping_until_ > 0 && busy_until_ > 0 && sleeping_until_ < busy_until_ - 1e-6 * reserve_us_;
}

bool Doorbell::push(Command c, bool wake) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!accepting_) return false;
    queue_.push_back(std::move(c));
    if (!wake && sleeping_until_ > 0) wake = sleeping_until_ - now_s() > 1e-6 * lazy_wake_us_;
  }
  if (wake) cv_.notify_one();
  return true;
}

void Doorbell::poke() {
  bool wake;
  {
    std::lock_guard<std::mutex> g(mu_);
    poked_ = true;
    wake = !devices_busy_past_wake();
  }
  if (wake) cv_.notify_one();
}

void Doorbell::open() {
  std::lock_guard<std::mutex> g(mu_);
  accepting_ = true;
}

void Doorbell::close(Command last) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (accepting_) queue_.push_back(std::move(last));
    accepting_ = false;
  }
  cv_.notify_one();
}

void Doorbell::take(std::vector<Command>& out) {
  std::lock_guard<std::mutex> g(mu_);
  out.swap(queue_);
}

void Doorbell::sleep(std::chrono::microseconds wait, double now, double busy_until) {
  std::unique_lock<std::mutex> l(mu_);
  if (queue_.empty() && !poked_ && wait.count() > 0) {
    busy_until_ = busy_until;
    sleeping_until_ = now + 1e-6 * static_cast<double>(wait.count());
    cv_.wait_for(l, wait, [&] { return !queue_.empty() || poked_; });
    sleeping_until_ = 0;
  }
  poked_ = false;
}

}  // namespace pwm::pathways
