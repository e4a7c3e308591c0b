// The controller's thread-safe front: the command queue, start-up and shutdown, and the entry
// points the client handles call. The commands run on the dispatcher thread (dispatcher.h).
#include "pathways/controller.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/env.h"
#include "common/time.h"
#include "pathways/dispatcher.h"

namespace pwm::pathways {

RuntimeOptions RuntimeOptions::from_env() {
  RuntimeOptions o;
  o.latency = LatencyPolicy::from_env();
  if (const std::string p = env_string("PWM_PW_SCHEDULER"); !p.empty()) o.scheduler = scheduler_by_name(p);
  o.island_ordering = env_double("PWM_PW_ISLAND_ORDERING", 1) != 0;
  o.trace_path = env_string("PWM_PW_TRACE");
  o.timeout_s = env_double("PWM_COLL_TIMEOUT", o.timeout_s);
  return o;
}

// ---- Controller ----

Controller::Controller(std::shared_ptr<collectives::Transport> t, RuntimeOptions o)
    : t_(std::move(t)), opts_(std::move(o)), bell_(opts_.latency) {
  PWM_CHECK(t_->rank() == 0, "the Pathways controller runs on world rank 0");
  if (t_->size() < 2) PWM_THROW("pathways: needs at least 2 ranks (a controller and a worker), got {}", t_->size());
}

Controller::~Controller() {
  if (thread_.joinable()) thread_.join();
}

void Controller::start() {
  d_ = std::make_unique<Dispatcher>(*this, *t_, bell_);
  rm_ = std::make_unique<ResourceManager>(d_->hello(), opts_.islands);
  memory_cap_ = d_->min_memory_cap();
  d_->init_schedulers(rm_->num_islands());
  bell_.open();
  thread_ = std::thread([this] { thread_main(); });
}

void Controller::thread_main() {
  try {
    d_->loop();
  } catch (const std::exception& e) {
    t_->abort(fmt::format("error: [rank 0] pathways dispatcher: {}", e.what()));
  }
}

void Controller::shutdown() {
  bell_.close([](Dispatcher& d) { d.begin_shutdown(); });
  if (thread_.joinable()) thread_.join();
}

std::vector<int> Controller::lost_workers() const { return d_ ? d_->lost() : std::vector<int>{}; }

void Controller::submit_run(std::shared_ptr<ProgramState> p, std::vector<std::shared_ptr<ArrayState>> in,
                            std::vector<std::shared_ptr<ArrayState>> out, RunOptions o, uint64_t run_id, uint64_t owner,
                            double weight) {
  auto outs = out;
  if (!enqueue([p = std::move(p), in = std::move(in), out = std::move(out), o, run_id, owner, weight](Dispatcher& d) mutable {
        d.run(std::move(p), std::move(in), std::move(out), o, run_id, owner, weight);
      }))
    for (auto& a : outs) a->status.fail("pathways runtime is shut down");
}

void Controller::submit_put(std::shared_ptr<ArrayState> a, std::vector<std::vector<uint8_t>> shards) {
  auto keep = a;
  if (!enqueue([a = std::move(a), s = std::move(shards)](Dispatcher& d) mutable { d.put(std::move(a), std::move(s)); }))
    keep->status.fail("pathways runtime is shut down");
}

void Controller::fetch(std::shared_ptr<ArrayState> a, std::shared_ptr<FutureState<HostTensor>> f) {
  if (!enqueue([a, f](Dispatcher& d) { d.fetch(a, f); }, true)) f->fail("pathways runtime is shut down");
}

void Controller::stats(std::shared_ptr<FutureState<std::vector<WorkerStats>>> f) {
  if (!enqueue([f](Dispatcher& d) { d.stats(f); }, true)) f->fail("pathways runtime is shut down");
}

void Controller::drain(int device, bool undrain, std::shared_ptr<FutureState<std::monostate>> f) {
  if (!enqueue([=](Dispatcher& d) { d.drain(device, undrain, f); }, true)) f->fail("pathways runtime is shut down");
}

void Controller::usage(std::shared_ptr<FutureState<std::vector<ClientUsage>>> f) {
  if (!enqueue([f](Dispatcher& d) { f->set(d.usage()); }, true)) f->fail("pathways runtime is shut down");
}

void Controller::add_client(uint64_t id, const std::string& name, double weight) {
  std::lock_guard<std::mutex> g(clients_mu_);
  clients_[id] = ClientRec{name, weight, false};
}

std::string Controller::client_name(uint64_t id) const {
  std::lock_guard<std::mutex> g(clients_mu_);
  auto it = clients_.find(id);
  return it == clients_.end() ? fmt::format("{}", id) : fmt::format("'{}' (id {})", it->second.name, id);
}

std::map<uint64_t, Controller::ClientRec> Controller::clients() const {
  std::lock_guard<std::mutex> g(clients_mu_);
  return clients_;
}

bool Controller::client_closed(uint64_t id) const {
  std::lock_guard<std::mutex> g(clients_mu_);
  auto it = clients_.find(id);
  return it == clients_.end() || it->second.closed;
}

void Controller::free_object(uint64_t id) {
  enqueue([id](Dispatcher& d) { d.free_object(id); });
}

void Controller::free_owner(uint64_t owner) {
  {
    std::lock_guard<std::mutex> g(clients_mu_);
    if (auto it = clients_.find(owner); it != clients_.end()) it->second.closed = true;
  }
  enqueue([owner](Dispatcher& d) { d.free_owner(owner); });
}

void Controller::evict(std::shared_ptr<dataflow::LoweredProgram> lp) {
  enqueue([lp](Dispatcher& d) { d.evict(*lp); });
}

}  // namespace pwm::pathways
