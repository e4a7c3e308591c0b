#include "pathways/wire.h"

#include "pathways/tags.h"

namespace pwm::pathways {

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kLoadProgram: return "load_program";
    case MsgType::kEvictProgram: return "evict_program";
    case MsgType::kRun: return "run";
    case MsgType::kReleaseStage: return "release_stage";
    case MsgType::kPut: return "put";
    case MsgType::kFetch: return "fetch";
    case MsgType::kFree: return "free";
    case MsgType::kFreeOwner: return "free_owner";
    case MsgType::kMoveOut: return "move_out";
    case MsgType::kMoveIn: return "move_in";
    case MsgType::kStats: return "stats";
    case MsgType::kShutdown: return "shutdown";
    case MsgType::kCancelRun: return "cancel_run";
    case MsgType::kEvict: return "evict";
    case MsgType::kCountContext: return "count_context";
    case MsgType::kDrainContext: return "drain_context";
    case MsgType::kHello: return "hello";
    case MsgType::kRunDone: return "run_done";
    case MsgType::kStageDone: return "stage_done";
    case MsgType::kNodeEvent: return "node_event";
    case MsgType::kFetchReply: return "fetch_reply";
    case MsgType::kStatsReply: return "stats_reply";
    case MsgType::kBye: return "bye";
    case MsgType::kTrace: return "trace";
    case MsgType::kContextCount: return "context_count";
    case MsgType::kContextDrained: return "context_drained";
    case MsgType::kHeartbeat: return "heartbeat";
  }
  return "?";
}

namespace {
// Frame header, at the start of every header-tag message.
struct FrameHeader {
  uint64_t bytes;    // frame length (without this header)
  uint32_t separate; // 1: the bytes follow on kCtrlBodyTag
  uint32_t final;    // 1: the sender sends nothing more to this peer
};
static_assert(sizeof(FrameHeader) == 16);
}  // namespace

struct Channel::Peer {
  bool listening = false;
  bool closed = false;           // we sent our final frame
  bool recv_posted = false;
  bool in_body = false;
  bool final_pending = false;    // the header being completed announced the final frame
  bool dropped = false;          // lost (drop()): neither sent to nor received from
  collectives::Request req;
  std::vector<uint8_t> hdr = std::vector<uint8_t>(sizeof(FrameHeader) + kInlineBytes);
  std::vector<uint8_t> body;
  Writer bundle;
};

Channel::Channel(collectives::Transport& t) : t_(t) {
  PWM_CHECK_GE(t_.max_tag(), tags::kMaxTagNeeded);
}

Channel::~Channel() = default;

Channel::Peer& Channel::peer(int p) {
  auto& s = peers_[p];
  if (!s) s = std::make_unique<Peer>();
  return *s;
}

bool Channel::listening(int p) const {
  auto it = peers_.find(p);
  return it != peers_.end() && it->second->listening;
}

void Channel::listen(int p) {
  Peer& s = peer(p);
  PWM_CHECK(!s.listening, "already listening to rank {}", p);
  s.listening = true;
  post_header_recv(p, s);
}

void Channel::post_header_recv(int p, Peer& s) {
  s.req = t_.irecv(s.hdr.data(), s.hdr.size(), p, tags::kCtrlHeaderTag);
  s.recv_posted = true;
  s.in_body = false;
}

void Channel::post(int p, MsgType type, const std::vector<uint8_t>& body) {
  const size_t at = begin_message(p, type);
  peer(p).bundle.bytes(body.data(), body.size());
  end_message(p, at);
}

Writer& Channel::bundle(int p) { return peer(p).bundle; }

size_t Channel::begin_message(int p, MsgType type) {
  Peer& s = peer(p);
  PWM_CHECK(!s.closed || s.dropped, "message {} posted to rank {} after close", msg_type_name(type), p);  // (dropped: discarded at flush)
  s.bundle.put<uint32_t>(static_cast<uint32_t>(type));
  s.bundle.put<uint32_t>(0);
  return s.bundle.size() - sizeof(uint32_t);
}

void Channel::end_message(int p, size_t at) {
  Writer& b = peer(p).bundle;
  b.patch<uint32_t>(at, static_cast<uint32_t>(b.size() - at - sizeof(uint32_t)));
}

void Channel::drop(int p) {
  Peer& s = peer(p);
  s.dropped = s.closed = true;
  s.listening = false;
  s.bundle.take();
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (it->peer != p) {
      ++it;
      continue;
    }
    dropped_.push_back(std::move(*it));
    it = sends_.erase(it);
  }
}

void Channel::close(int p) {
  Peer& s = peer(p);
  s.closed = true;
  send_frame(p, s.bundle.take(), /*final=*/true);
}

void Channel::send_frame(int p, std::vector<uint8_t>&& frame, bool final) {
  FrameHeader h{frame.size(), frame.size() > kInlineBytes ? 1u : 0u, final ? 1u : 0u};
  auto head = std::make_shared<std::vector<uint8_t>>(sizeof(h) + (h.separate ? 0 : frame.size()));
  std::memcpy(head->data(), &h, sizeof(h));
  if (!h.separate && !frame.empty()) std::memcpy(head->data() + sizeof(h), frame.data(), frame.size());
  sends_.push_back({t_.isend(head->data(), head->size(), p, tags::kCtrlHeaderTag), head, p});
  if (h.separate) {
    auto body = std::make_shared<std::vector<uint8_t>>(std::move(frame));
    sends_.push_back({t_.isend(body->data(), body->size(), p, tags::kCtrlBodyTag), body, p});
  }
}

bool Channel::flush() {
  bool any = false;
  for (auto& [p, s] : peers_) {
    if (s->dropped) s->bundle.take();  // (what was written for a lost peer is discarded)
    if (s->closed || s->bundle.size() == 0) continue;
    send_frame(p, s->bundle.take(), false);
    any = true;
  }
  return any;
}

void Channel::deliver(int p, const uint8_t* data, size_t n, std::vector<Message>& inbox) {
  Reader r(data, n);
  while (r.remaining() > 0) {
    Message m;
    m.peer = p;
    m.type = static_cast<MsgType>(r.get<uint32_t>());
    auto len = r.get<uint32_t>();
    const uint8_t* b = r.bytes(len);
    m.body.assign(b, b + len);
    inbox.push_back(std::move(m));
  }
}

bool Channel::progress(std::vector<Message>& inbox) {
  bool any = false;
  while (!sends_.empty()) {  // sends complete in order (mostly); test from the front
    if (!t_.test(sends_.front().req, nullptr)) break;
    sends_.pop_front();
    any = true;
  }
  for (auto& [p, sp] : peers_) {
    Peer& s = *sp;
    if (s.dropped) continue;
    // A frame may be followed at once by the next; take what has arrived.
    while (s.recv_posted) {
      size_t got = 0;
      if (!t_.test(s.req, &got)) break;
      any = true;
      s.recv_posted = false;
      if (!s.in_body) {
        PWM_CHECK_GE(got, sizeof(FrameHeader));
        FrameHeader h;
        std::memcpy(&h, s.hdr.data(), sizeof(h));
        s.final_pending = h.final != 0;
        if (h.separate) {
          s.body.resize(h.bytes);
          s.req = t_.irecv(s.body.data(), s.body.size(), p, tags::kCtrlBodyTag);
          s.recv_posted = true;
          s.in_body = true;
          continue;
        }
        PWM_CHECK_EQ(got, sizeof(FrameHeader) + h.bytes);
        deliver(p, s.hdr.data() + sizeof(h), h.bytes, inbox);
      } else {
        PWM_CHECK_EQ(got, s.body.size());
        deliver(p, s.body.data(), s.body.size(), inbox);
        std::vector<uint8_t>().swap(s.body);
      }
      if (s.final_pending)
        s.listening = false;
      else
        post_header_recv(p, s);
    }
  }
  return any;
}

}  // namespace pwm::pathways
