// The client handles (client.h) and the Runtime front (runtime.h). Everything here runs on
// client threads; the work itself is queued to the dispatcher (controller.cc).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pathways/controller.h"
#include "pathways/object_id.h"
#include "pathways/runtime.h"

namespace pwm::pathways {

// ---- handle states ----

SliceState::~SliceState() {
  if (auto c = ctl.lock()) c->rm().release(info.id);
}

ArrayState::~ArrayState() {
  if (auto c = ctl.lock()) c->free_object(id);
}

ProgramState::~ProgramState() {
  if (lowered)
    if (auto c = ctl.lock()) c->evict(lowered);
}

void ClientState::disconnect() {
  if (closed.exchange(true)) return;
  std::map<std::string, Program> drop;
  {
    std::lock_guard<std::mutex> g(mu);
    drop.swap(opbyop);
  }
  drop.clear();  // evicts the cached OpByOp programs
  if (ctl) ctl->free_owner(id);
}

ClientState::~ClientState() { disconnect(); }

// ---- Slice ----

int Slice::id() const { return s_->info.id; }
int Slice::size() const { return static_cast<int>(s_->info.devices.size()); }
int Slice::island() const { return s_->info.island; }
const std::vector<int>& Slice::mesh() const { return s_->info.mesh; }
bool Slice::lost() const {
  if (auto c = s_->ctl.lock())
    if (c->rm().has_slice(id())) return c->rm().orphaned(id());
  return false;
}

std::vector<int> Slice::devices() const {
  if (auto c = s_->ctl.lock())
    if (c->rm().has_slice(id())) return c->rm().slice(id()).devices;
  return s_->info.devices;
}

// ---- Array ----

uint64_t Array::id() const { return s_->id; }
const Slice& Array::slice() const { return s_->slice; }
const dataflow::ArgSpec& Array::spec() const { return s_->spec; }
dataflow::TensorSpec Array::logical() const { return s_->spec.logical(s_->slice.size()); }
bool Array::ready() const { return s_->status.done(); }
bool Array::ok() const { return s_->status.done() && !s_->status.failed(); }
std::string Array::error() const { return s_->status.error(); }
void Array::wait() const {
  if (!s_->status.done()) {
    s_->awaited = true;
    if (auto c = s_->ctl.lock()) c->poke();
  }
  s_->status.get();
}

uint64_t Array::owner() const { return s_->owner; }
bool Array::released() const { return s_->released; }

void Array::release() {
  if (s_->released.exchange(true)) return;
  if (auto c = s_->ctl.lock()) c->free_object(s_->id);
}

Future<HostTensor> Array::fetch() const {
  s_->awaited = true;
  auto f = std::make_shared<FutureState<HostTensor>>();
  if (s_->released)
    f->fail(fmt::format("array {} was released (Array::release): its object is freed", s_->id));
  else if (auto c = s_->ctl.lock())
    c->fetch(s_, f);
  else
    f->fail("pathways runtime is gone");
  return Future<HostTensor>(f);
}

// ---- Program, ProgramBuilder ----

const dataflow::ProgramDef& Program::def() const { return s_->def; }

ProgramBuilder::ProgramBuilder(std::string name) : b_(std::move(name)) {}

static void keep_slice(std::vector<Slice>& slices, const Slice& s) {
  for (auto& k : slices)
    if (k.id() == s.id()) return;
  slices.push_back(s);
}

Value ProgramBuilder::param(const Slice& slice, dataflow::ArgSpec spec) {
  PWM_CHECK(slice.valid(), "param on an empty Slice");
  keep_slice(slices_, slice);
  return b_.param(slice.id(), slice.size(), std::move(spec));
}

std::vector<Value> ProgramBuilder::call(const std::string& kernel, const Slice& slice, const std::vector<Value>& inputs,
                                        std::vector<int64_t> attrs) {
  PWM_CHECK(slice.valid(), "call on an empty Slice");
  keep_slice(slices_, slice);
  return b_.call(kernel, slice.id(), slice.size(), inputs, std::move(attrs));
}

void ProgramBuilder::output(const Value& v) { b_.output(v); }

Program ProgramBuilder::build() {
  auto s = std::make_shared<ProgramState>();
  s->def = b_.build();  // (throws when called twice)
  s->slices = std::move(slices_);
  Program p;
  p.s_ = std::move(s);
  return p;
}

Program Program::over(dataflow::ProgramDef def, const std::vector<Slice>& slices) {
  auto s = std::make_shared<ProgramState>();
  const auto slice = [&](int i) -> const Slice& {
    PWM_CHECK(i >= 0 && static_cast<size_t>(i) < slices.size() && slices[static_cast<size_t>(i)].valid(),
              "program '{}' names slice {} of {}", def.name, i, slices.size());
    const Slice& sl = slices[static_cast<size_t>(i)];
    keep_slice(s->slices, sl);
    return sl;
  };
  for (dataflow::ParamDef& p : def.params) p.slice = slice(p.slice).id();
  for (dataflow::NodeDef& n : def.nodes) n.slice = slice(n.slice).id();
  s->def = std::move(def);
  Program p;
  p.s_ = std::move(s);
  return p;
}

// ---- Client ----

uint64_t Client::id() const { return s_->id; }
const std::string& Client::name() const { return s_->name; }
double Client::weight() const { return s_->weight; }
void Client::disconnect() { s_->disconnect(); }
bool Client::connected() const { return !s_->closed; }

void Client::check_usable(const char* what) const {
  PWM_CHECK(s_, "{} on an empty Client", what);
  if (s_->closed) PWM_THROW("{}: client {} is disconnected; its objects and programs were reclaimed", what,
                            s_->ctl->client_name(s_->id));
}

namespace {
// Isolation: a handle is valid only for the client that created it.
void check_owner(const Controller& ctl, uint64_t client, uint64_t owner, const std::string& what) {
  if (owner != client)
    PWM_THROW("client {}: {} belongs to client {}; a handle is valid only for the client that created it",
              ctl.client_name(client), what, ctl.client_name(owner));
}
}  // namespace

Slice Client::allocate(int devices, std::vector<int> mesh, int island) {
  check_usable("allocate");
  auto st = std::make_shared<SliceState>();
  st->info = s_->ctl->rm().allocate(devices, std::move(mesh), island);
  st->owner = s_->id;
  st->ctl = s_->ctl;
  Slice s;
  s.s_ = std::move(st);
  return s;
}

Array Client::put(const Slice& slice, dataflow::Sharding sharding, const dataflow::TensorSpec& logical, const void* data) {
  PWM_CHECK(slice.valid(), "put on an empty Slice");
  check_usable("put");
  check_owner(*s_->ctl, s_->id, slice.s_->owner, fmt::format("slice {}", slice.id()));
  const int n = slice.size();
  dataflow::ArgSpec spec{logical, sharding};
  std::vector<std::vector<uint8_t>> shards(n);
  const auto* p = static_cast<const uint8_t*>(data);
  if (sharding == dataflow::Sharding::kSplit) {
    if (logical.shape.empty() || logical.shape[0] % n != 0)
      PWM_THROW("put: cannot split {} along dimension 0 over {} devices", logical.str(), n);
    spec.shard.shape[0] /= n;
    const size_t b = spec.shard.bytes();
    for (int k = 0; k < n; ++k) shards[k].assign(p + k * b, p + (k + 1) * b);
  } else {
    for (int k = 0; k < n; ++k) shards[k].assign(p, p + logical.bytes());
  }
  auto a = std::make_shared<ArrayState>();
  a->id = output_object_id(s_->ctl->new_id(), 0);
  a->slice = slice;
  a->spec = spec;
  a->owner = s_->id;
  a->ctl = s_->ctl;
  s_->ctl->submit_put(a, std::move(shards));
  Array r;
  r.s_ = std::move(a);
  return r;
}

std::vector<Array> Client::run(const Program& p, const std::vector<Array>& inputs, RunOptions o) {
  PWM_CHECK(p.valid(), "run of an empty Program");
  check_usable("run");
  auto& ps = p.s_;
  // Isolation: the program (bound to the first client that runs it), its slices and its inputs
  // must all be this client's; nothing is queued otherwise.
  uint64_t prog_owner = 0;
  if (!ps->owner.compare_exchange_strong(prog_owner, s_->id))
    check_owner(*s_->ctl, s_->id, prog_owner, fmt::format("program '{}'", ps->def.name));
  for (auto& sl : ps->slices)
    check_owner(*s_->ctl, s_->id, sl.s_->owner, fmt::format("slice {} (used by program '{}')", sl.id(), ps->def.name));
  std::vector<std::shared_ptr<ArrayState>> in, out;
  PWM_CHECK(o.donate.empty() || o.donate.size() == inputs.size(), "run of '{}': {} donate flags for {} inputs",
            ps->def.name, o.donate.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Array& a = inputs[i];
    PWM_CHECK(a.valid(), "run of '{}' with an empty Array", ps->def.name);
    check_owner(*s_->ctl, s_->id, a.s_->owner, fmt::format("input {} of '{}' (array {})", i, ps->def.name, a.id()));
    if (a.s_->released)
      PWM_THROW("client {}: input {} of '{}' (array {}) was released (Array::release)", s_->ctl->client_name(s_->id), i,
                ps->def.name, a.id());
    in.push_back(a.s_);
  }
  ps->ctl = s_->ctl;
  const uint64_t run_id = s_->ctl->new_id();
  PWM_CHECK_LT(run_id, kMaxRunId);
  std::vector<Array> result;
  for (size_t k = 0; k < ps->def.outputs.size(); ++k) {
    const dataflow::ValueId v = ps->def.outputs[k];
    auto a = std::make_shared<ArrayState>();
    a->id = output_object_id(run_id, static_cast<uint32_t>(k));
    for (auto& s : ps->slices)
      if (s.id() == ps->def.value_slice(v)) a->slice = s;
    a->spec = ps->def.value_spec(v);
    a->owner = s_->id;
    a->ctl = s_->ctl;
    out.push_back(a);
    Array r;
    r.s_ = a;
    result.push_back(std::move(r));
  }
  s_->ctl->submit_run(ps, std::move(in), std::move(out), o, run_id, s_->id, s_->weight);
  return result;
}

std::vector<Array> Client::call(const std::string& kernel, const Slice& slice, const std::vector<Array>& inputs,
                                std::vector<int64_t> attrs, RunOptions o) {
  check_usable("call");
  PWM_CHECK(slice.valid(), "call of '{}' on an empty Slice", kernel);
  check_owner(*s_->ctl, s_->id, slice.s_->owner, fmt::format("slice {}", slice.id()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    PWM_CHECK(inputs[i].valid(), "call of '{}' with an empty Array", kernel);
    check_owner(*s_->ctl, s_->id, inputs[i].s_->owner, fmt::format("input {} of '{}' (array {})", i, kernel, inputs[i].id()));
  }
  // The call's signature as bytes: kernel, slice, attributes, each input's slice and spec.
  std::string key = kernel;
  key.push_back('\0');
  auto add = [&](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  const int sid = slice.id();
  const size_t na = attrs.size();
  add(&sid, sizeof(sid));
  add(&na, sizeof(na));
  add(attrs.data(), attrs.size() * sizeof(int64_t));
  for (auto& a : inputs) {
    const int id = a.slice().id();
    const uint8_t meta[2] = {static_cast<uint8_t>(a.spec().sharding), static_cast<uint8_t>(a.spec().shard.dtype)};
    add(&id, sizeof(id));
    add(meta, sizeof(meta));
    add(a.spec().shard.shape.data(), a.spec().shard.shape.size() * sizeof(int64_t));
    key.push_back('|');
  }
  Program p;
  {
    std::lock_guard<std::mutex> g(s_->mu);
    auto it = s_->opbyop.find(key);
    if (it != s_->opbyop.end()) {
      p = it->second;
    } else {
      ProgramBuilder b(kernel);
      std::vector<Value> params;
      for (auto& a : inputs) params.push_back(b.param_like(a));
      for (auto& v : b.call(kernel, slice, params, attrs)) b.output(v);
      p = s_->opbyop[key] = b.build();
    }
  }
  return run(p, inputs, o);
}

std::vector<WorkerStats> Client::stats() {
  check_usable("stats");
  auto f = std::make_shared<FutureState<std::vector<WorkerStats>>>();
  s_->ctl->stats(f);
  return f->get();
}

ClientUsage Client::usage() {
  check_usable("usage");
  auto f = std::make_shared<FutureState<std::vector<ClientUsage>>>();
  s_->ctl->usage(f);
  for (const ClientUsage& u : f->get())
    if (u.id == s_->id) return u;
  ClientUsage none;
  none.id = s_->id;
  none.name = s_->name;
  return none;
}

void Client::drain(int device) {
  auto f = std::make_shared<FutureState<std::monostate>>();
  s_->ctl->drain(device, false, f);
  f->get();
}

void Client::undrain(int device) {
  auto f = std::make_shared<FutureState<std::monostate>>();
  s_->ctl->drain(device, true, f);
  f->get();
}

std::string Client::describe() const { return s_->ctl->rm().describe(); }

// ---- Runtime ----

Runtime::Runtime(std::shared_ptr<collectives::Transport> transport, RuntimeOptions options)
    : c_(std::make_shared<Controller>(std::move(transport), std::move(options))) {
  c_->start();
}

Runtime::~Runtime() {
  try {
    shutdown();
  } catch (...) {
  }
}

Client Runtime::client(const std::string& name) { return client(name, ClientOptions{}); }

Client Runtime::client(const std::string& name, ClientOptions options) {
  if (!(options.weight > 0)) PWM_THROW("client '{}': weight must be positive, got {}", name, options.weight);
  auto st = std::make_shared<ClientState>();
  st->id = c_->new_id();
  st->name = name;
  st->weight = options.weight;
  st->ctl = c_;
  c_->add_client(st->id, name, options.weight);
  Client c;
  c.s_ = std::move(st);
  return c;
}

std::vector<ClientUsage> Runtime::usage() {
  auto f = std::make_shared<FutureState<std::vector<ClientUsage>>>();
  c_->usage(f);
  return f->get();
}

uint64_t Runtime::memory_cap_bytes() const { return c_->memory_cap(); }

const char* Runtime::scheduler_name() const {
  return c_->options().scheduler ? c_->options().scheduler(0)->name() : "fifo";
}

int Runtime::num_devices() const { return c_->rm().num_devices(); }
int Runtime::num_islands() const { return c_->rm().num_islands(); }
std::string Runtime::describe() const { return c_->rm().describe(); }
void Runtime::shutdown() { c_->shutdown(); }

std::vector<int> Runtime::lost_workers() const { return c_->lost_workers(); }

}  // namespace pwm::pathways
