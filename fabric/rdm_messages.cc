// Messages: the connect handshake, fragmentation and in-order reassembly, the event queue.
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <cstring>

#include "rdm_endpoint.h"
#include "tandem/log.h"

namespace tandem::fabric {
namespace {

// Send buffers (each max_message) an endpoint may have in flight before Send() waits.
constexpr size_t kMaxSendBuffers = 32;
// A caller's frame the provider does not take within this long (-FI_EAGAIN: a full queue, or a
// peer that died and is being reconnected to) is left to the progress thread, and the caller
// goes on: a thread that sends to several peers (the client's flusher) must not sit out a dead
// one's send_timeout while the others wait for it.
constexpr auto kDeferAfter = std::chrono::microseconds(500);
// Bytes of one peer's frames that may wait so before its senders wait too (at most until the
// peer is declared lost). Each is a copy of its own size, outside the send buffers: a dead peer
// takes none of those from the live ones.
constexpr size_t kMaxDeferredPerPeer = 64u << 20;
// Largest frame we inject from the stack.
constexpr size_t kInjectMax = 256;

// A timeout for a message: whole milliseconds as such (Millis converts), else microseconds.
std::string Ms(Micros t) {
  return t.count() % 1000 == 0 ? std::to_string(t.count() / 1000) + " ms" : std::to_string(t.count()) + " us";
}

}  // namespace

Conn* RdmEndpoint::FindConn(PeerId peer) {
  auto it = peers_.find(peer);
  return it == peers_.end() ? nullptr : it->second.get();
}

Result<PeerId> RdmEndpoint::Connect(const std::string& host_port, Millis timeout) {
  std::string host, service;
  if (!SplitHostPort(host_port, &host, &service)) {
    return Status::Invalid("fabric: bad address '" + host_port + "' (want host:port)");
  }
  auto deadline = Clock::now() + timeout;

  // Resolve host:port into this provider's address format, then into our AV.
  fi_info* hints = MakeHints(provider_);
  hints->addr_format = h_->info->addr_format;
  fi_info* info = nullptr;
  int r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), host.c_str(), service.c_str(), 0, hints, &info);
  fi_freeinfo(hints);
  if (r != 0 || info->dest_addr == nullptr) {
    if (info) fi_freeinfo(info);
    return FiError(Code::kLinkLost, "fabric: cannot resolve " + host_port + " for " + provider_, r ? r : -FI_EADDRNOTAVAIL);
  }
  fi_addr_t addr = FI_ADDR_UNSPEC;
  r = fi_av_insert(h_->av, info->dest_addr, 1, &addr, 0, nullptr);
  fi_freeinfo(info);
  if (r != 1) return FiError(Code::kLinkLost, "fabric: fi_av_insert of " + host_port, r < 0 ? r : -FI_EADDRNOTAVAIL);

  PeerId id;
  wire::Header h;
  h.type = wire::Type::kConnect;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto c = std::make_unique<Conn>();
    do c->conn_id = rng_(); while (c->conn_id == 0 || by_conn_id_.count(c->conn_id));
    c->id = id = next_peer_++;
    c->addr = addr;
    c->name = host_port;
    h.conn_id = c->conn_id;
    by_conn_id_[c->conn_id] = id;
    peers_[id] = std::move(c);
  }
  // CONNECT carries our raw address (the listener needs it to answer) and our exact stack.
  auto payload = wire::EncodeConnect({fi_version(), provider_, my_address_});
  h.total_len = payload.size();
  // Never injected: a refused connection must surface as an error completion.
  Status st = SendFrame(id, addr, h, payload.data(), payload.size(), deadline, false);

  std::unique_lock<std::mutex> lock(mu_);
  Conn* c = FindConn(id);
  if (st.ok()) cv_.wait_until(lock, deadline, [&] { return c->state != Conn::State::kConnecting; });
  if (st.ok() && c->state == Conn::State::kUp) return id;
  // Two provider stacks (net and tcp;ofi_rxm) never reach the handshake that would say so.
  const std::string other_stack =
      "a server on another provider stack than this " + provider_ + " cannot answer either";
  if (!st.ok()) {
    const bool timed_out = st.code() == Code::kTimeout;
    std::string why = "fabric: connect to " + host_port + ": " + st.message();
    if (timed_out) why += " (" + other_stack + ")";
    st = Status(timed_out ? Code::kTimeout : Code::kLinkLost, why);
  } else if (c->state == Conn::State::kFailed) {
    st = c->failure;
  } else {
    st = Status(Code::kTimeout, "fabric: no answer from " + host_port + " within " + Ms(timeout) +
                                    " (nothing listening there, or unreachable; " + other_stack + ")");
  }
  RemoveConn(id);
  return st;
}

void RdmEndpoint::SendBye(fi_addr_t addr, uint64_t conn_id) {
  // Best effort: a dead peer must not delay closing.
  wire::Header h;
  h.type = wire::Type::kBye;
  h.conn_id = conn_id;
  uint8_t frame[wire::kHeaderSize];
  wire::EncodeHeader(h, frame);
  ssize_t r = inject_size_ >= sizeof(frame)
                  ? InProvider(*h_, [&] { return fi_inject(h_->ep, frame, sizeof(frame), addr); })
                  : -FI_EMSGSIZE;
  if (r != 0) log::Debug("fabric: goodbye on {:#x} not sent: {}", conn_id, fi_strerror(static_cast<int>(-r)));
}

void RdmEndpoint::Close(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn* c = FindConn(peer);
  if (c == nullptr) return;
  if (c->state == Conn::State::kUp) {
    // Messages handed to the progress thread and not posted yet go before the goodbye, which
    // would otherwise overtake them (one the provider cannot take now is dropped).
    for (auto it = control_deferred_.begin(); it != control_deferred_.end();) {
      SendOp* op = it->get();
      if (!op->handed_off || op->peer != peer) {
        ++it;
        continue;
      }
      c->deferred -= op->len;
      if (PostSend(*op) == 0) {
        sends_in_flight_.insert(it->release());
      } else {
        ReleaseBuffer(std::move(op->buf));
      }
      it = control_deferred_.erase(it);
    }
    SendBye(c->addr, c->conn_id);
  }
  RemoveConn(peer);
}

void RdmEndpoint::RemoveConn(PeerId peer) {
  Conn* c = FindConn(peer);
  if (c == nullptr) return;
  // RMA still to be posted to this peer can no longer go anywhere.
  for (auto& [id, op] : rma_ops_) {
    if (op->peer == peer && op->error.ok()) op->error = Status(Code::kLinkLost, "fabric: peer closed");
  }
  int r = fi_av_remove(h_->av, &c->addr, 1, 0);
  if (r != 0) log::Warn("fabric: fi_av_remove for {}: {}", c->name, fi_strerror(-r));
  by_conn_id_.erase(c->conn_id);
  peers_.erase(peer);
  cv_.notify_all();
}

void RdmEndpoint::PeerFailed(PeerId peer, Status why) {
  Conn* c = FindConn(peer);
  if (c == nullptr) return;
  if (c->state == Conn::State::kConnecting) {
    c->state = Conn::State::kFailed;
    c->failure = Status(Code::kLinkLost, "fabric: connect to " + c->name + ": " + why.message());
  } else if (c->state == Conn::State::kUp) {
    c->state = Conn::State::kLost;
    c->failure = Status(why.code(), "fabric: peer " + c->name + ": " + why.message());
    for (auto& [id, op] : rma_ops_) {
      if (op->peer == peer && op->error.ok()) op->error = c->failure;
    }
    Push(Event{EventKind::kPeerLost, peer, {}, c->failure});
  }
  cv_.notify_all();
}

Status RdmEndpoint::Send(PeerId peer, std::vector<uint8_t> data) {
  wire::Header h;
  fi_addr_t addr;
  bool backlogged = false;  // frames of this peer's wait for the provider (Backlogged)
  {
    std::lock_guard<std::mutex> lock(mu_);
    Conn* c = FindConn(peer);
    if (c == nullptr) return Status::Unknown("fabric: no peer " + std::to_string(peer));
    if (c->state != Conn::State::kUp) return c->failure.ok() ? Status(Code::kLinkLost, "fabric: peer not connected") : c->failure;
    addr = c->addr;
    h.conn_id = c->conn_id;
    h.msg_id = c->next_send_id++;
    backlogged = c->deferred > 0;
  }
  // A one-frame message goes out from the thread reading the CQ in Next() while one does (no
  // thread sends from within Next()): handed over, a launch + synchronize's message cost its
  // sender 1-2 us, against 10.7-11.7 sent from this thread while another read the socket (H100,
  // tcp, the round-trip probe; the socket's state moves between two cores on every message).
  // Otherwise one from a thread that has not sent for a while goes out from the busy-polling
  // progress thread. Either way only with a pooled buffer free at once and nothing of this
  // peer's waiting for the provider: a frame a dead peer refuses must not hold the pool, which
  // every other peer's sends need. Order is kept: the receiver delivers by msg_id, whoever
  // posted the frame.
  thread_local Clock::time_point last_send;
  const Clock::time_point now = Clock::now();
  const bool cold = hand_off_idle_us_ > 0 && now - last_send > std::chrono::microseconds(hand_off_idle_us_);
  last_send = now;
  const auto deadline = now + send_timeout_;
  const bool to_reader = cq_callers_.load() > 0;
  Result<Buffer> buf = Status(Code::kTimeout, "not handed over");
  if (data.size() <= max_message_ && ((cold && progress_hot_.load()) || to_reader) && !backlogged)
    buf = TakeBuffer(deadline, /*wait=*/false);
  if (buf.ok()) {
    auto op = std::make_unique<SendOp>();
    op->peer = peer;
    op->buf = std::move(*buf);
    h.frag_count = 1;
    h.total_len = data.size();
    wire::EncodeHeader(h, op->buf.data.get());
    if (!data.empty()) std::memcpy(op->buf.data.get() + wire::kHeaderSize, data.data(), data.size());
    op->len = wire::kHeaderSize + data.size();
    op->addr = addr;
    Status st = Defer(std::move(op), deadline);
    if (!st.ok()) {
      // Its msg_id is taken: a later message would wait at the receiver for this one forever.
      std::lock_guard<std::mutex> lock(mu_);
      PeerFailed(peer, st);
      return st;
    }
    sends_handed_off_.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }
  // Fragments of max_message; the receiver places each by offset and delivers in msg_id order.
  size_t count = data.empty() ? 1 : (data.size() + max_message_ - 1) / max_message_;
  h.frag_count = static_cast<uint32_t>(count);
  h.total_len = data.size();
  for (size_t i = 0; i < count; ++i) {
    h.frag_index = static_cast<uint32_t>(i);
    h.offset = i * max_message_;
    size_t n = std::min(max_message_, data.size() - h.offset);
    Status st = SendFrame(peer, addr, h, data.data() + h.offset, n, deadline, true, true);
    if (!st.ok()) {
      // A half-sent message would block every later one at the receiver: the link is done.
      std::lock_guard<std::mutex> lock(mu_);
      PeerFailed(peer, st);
      return st;
    }
  }
  return Status::Ok();
}

Status RdmEndpoint::SendFrame(PeerId peer, fi_addr_t addr, const wire::Header& h, const uint8_t* payload, size_t len,
                              Clock::time_point deadline, bool may_inject, bool may_defer) {
  size_t total = wire::kHeaderSize + len;
  // A peer with frames waiting for the provider would refuse this one too: it joins them.
  const bool join = may_defer && Backlogged(peer);
  const auto try_until = may_defer ? std::min(deadline, Clock::now() + kDeferAfter) : deadline;
  // Small frames go by fi_inject: no buffer to keep, no completion to reap.
  if (!join && may_inject && total <= std::min(inject_size_, kInjectMax)) {
    uint8_t frame[kInjectMax];
    wire::EncodeHeader(h, frame);
    if (len) std::memcpy(frame + wire::kHeaderSize, payload, len);
    Status st = PostWithRetry("fi_inject", try_until, [&] { return fi_inject(h_->ep, frame, total, addr); });
    if (!may_defer || st.code() != Code::kTimeout) return st;  // kTimeout: still -FI_EAGAIN
    return Defer(peer, addr, h, payload, len, deadline);
  }
  if (join) return Defer(peer, addr, h, payload, len, deadline);
  auto buf = TakeBuffer(deadline);
  if (!buf.ok()) return buf.status();
  auto* op = new SendOp();
  op->peer = peer;
  op->buf = std::move(*buf);
  wire::EncodeHeader(h, op->buf.data.get());
  if (len) std::memcpy(op->buf.data.get() + wire::kHeaderSize, payload, len);
  {
    std::lock_guard<std::mutex> lock(mu_);
    sends_in_flight_.insert(op);
  }
  Status st = PostWithRetry("fi_send", try_until,
                            [&] { return fi_send(h_->ep, op->buf.data.get(), total, op->buf.desc, addr, &op->fi); });
  if (!st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sends_in_flight_.erase(op);
      ReleaseBuffer(std::move(op->buf));
    }
    delete op;
    if (may_defer && st.code() == Code::kTimeout) return Defer(peer, addr, h, payload, len, deadline);
  }
  return st;
}

bool RdmEndpoint::Backlogged(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn* c = FindConn(peer);
  return c != nullptr && c->deferred > 0;
}

Status RdmEndpoint::Defer(PeerId peer, fi_addr_t addr, const wire::Header& h, const uint8_t* payload, size_t len,
                          Clock::time_point deadline) {
  auto buf = NewBuffer(wire::kHeaderSize + len);
  if (!buf.ok()) return buf.status();
  auto op = std::make_unique<SendOp>();
  op->peer = peer;
  op->buf = std::move(*buf);
  op->len = wire::kHeaderSize + len;
  op->addr = addr;
  wire::EncodeHeader(h, op->buf.data.get());
  if (len) std::memcpy(op->buf.data.get() + wire::kHeaderSize, payload, len);
  return Defer(std::move(op), deadline);
}

Status RdmEndpoint::Defer(std::unique_ptr<SendOp> op, Clock::time_point deadline) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    Conn* c = nullptr;
    // A peer that takes nothing keeps only its own senders waiting, once it holds this much.
    const bool room = cv_.wait_until(lock, deadline, [&] {
      c = FindConn(op->peer);
      return c == nullptr || c->state != Conn::State::kUp || c->deferred == 0 ||
             c->deferred + op->len <= kMaxDeferredPerPeer;
    });
    Status why;
    if (c == nullptr) why = Status(Code::kLinkLost, "fabric: peer closed");
    else if (c->state != Conn::State::kUp) why = c->failure.ok() ? Status(Code::kLinkLost, "fabric: peer not connected") : c->failure;
    else if (!room) why = Status(Code::kTimeout, "fabric: the peer took nothing (-FI_EAGAIN) before the deadline");
    if (!why.ok()) {
      ReleaseBuffer(std::move(op->buf));
      return why;
    }
    op->handed_off = true;
    op->deadline = deadline;
    c->deferred += op->len;
    control_deferred_.push_back(std::move(op));
    deferred_ = true;
  }
  // A progress thread that stopped polling meanwhile looks at its queue before it blocks
  // (ProgressLoop); one already blocked is woken.
  if (!progress_hot_.load()) Kick();
  return Status::Ok();
}

Status RdmEndpoint::PostWithRetry(const char* what, Clock::time_point deadline, const std::function<ssize_t()>& post) {
  ssize_t r = PostBetweenReads(post);
  if (r == -FI_EAGAIN) {
    // The provider needs progress: keep the progress thread spinning while we retry.
    ++waiters_;
    Kick();
    while ((r = PostBetweenReads(post)) == -FI_EAGAIN && Clock::now() < deadline) std::this_thread::yield();
    --waiters_;
  }
  if (r == 0) return Status::Ok();
  if (r == -FI_EAGAIN) return Status(Code::kTimeout, std::string(what) + ": no progress (-FI_EAGAIN) before the deadline");
  return FiError(Code::kLinkLost, what, static_cast<int>(r));
}

Result<Buffer> RdmEndpoint::TakeBuffer(Clock::time_point deadline, bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!free_buffers_.empty()) {
      Buffer b = std::move(free_buffers_.back());
      free_buffers_.pop_back();
      return b;
    }
    if (buffers_total_ < kMaxSendBuffers) {
      ++buffers_total_;
      lock.unlock();
      auto b = NewBuffer();
      if (!b.ok()) {
        lock.lock();
        --buffers_total_;
      }
      return b;
    }
    if (!wait) return Status(Code::kTimeout, "fabric: every send buffer is in flight");
    // All buffers are in flight: wait for completions, which the progress thread reaps.
    ++waiters_;
    Kick();
    bool woke = cv_.wait_until(lock, deadline, [&] { return !free_buffers_.empty(); });
    --waiters_;
    if (!woke) return Status(Code::kTimeout, "fabric: no send buffer freed before the deadline");
  }
}

void RdmEndpoint::ReleaseBuffer(Buffer b) {
  if (!b.pooled) {
    FreeBuffer(b);
    return;
  }
  free_buffers_.push_back(std::move(b));
  cv_.notify_all();
}

Result<Event> RdmEndpoint::Next(Micros timeout) {
  // A reply usually follows within microseconds: look for it a moment before sleeping, reading
  // the CQ from this thread (the progress thread stays off it meanwhile), so what arrives needs
  // no hand-over from another thread.
  auto spin_end = Clock::now() + std::min<Clock::duration>(std::chrono::microseconds(spin_us_.load()), timeout);
  if (events_pending_ == 0 && Clock::now() < spin_end) {
    // Counted while here, however it is left: the progress thread reads again once it is 0.
    struct Reading {
      explicit Reading(std::atomic<int>& n) : n_(n) { n_.fetch_add(1); }
      ~Reading() { n_.fetch_sub(1); }
      std::atomic<int>& n_;
    };
    {
      Reading reading(cq_callers_);
      if (!progress_hot_.load()) Kick();  // out of a blocking wait, which holds the CQ
      fi_cq_data_entry entries[kCqBatch];
      for (unsigned polls = 1; events_pending_ == 0 && Clock::now() < spin_end; ++polls) {
        // Politely, but a reader kept out by posters for long reads anyway (they wait for it).
        const bool polite = polls % 64 != 0;
        std::unique_lock<std::mutex> cq(cq_mu_, std::try_to_lock);
        if (cq.owns_lock()) {
          const ssize_t n = ReadCq(entries, polite);
          if (n > 0) {
            Dispatch(entries, n);
          } else if (n == -FI_EAVAIL) {
            DispatchError();
          } else if (n != -FI_EAGAIN) {
            // The progress thread logs it and backs off; this thread leaves the reading to it.
            log::Error("fabric: reading the completion queue: {}", fi_strerror(static_cast<int>(-n)));
            break;
          }
        }
        if (deferred_) RetryDeferred();  // the progress thread naps meanwhile
        // Now and then the CPU goes to another thread: on a few cores the one that answers.
        if (!polite) std::this_thread::yield();
      }
    }
    if (deferred_) RetryDeferred();  // what was handed over while this thread was leaving
  }
  std::unique_lock<std::mutex> lock(events_mu_);
  events_cv_.wait_for(lock, timeout, [&] { return !events_.empty() || interrupted_; });
  if (interrupted_) {
    interrupted_ = false;
    return Status(Code::kTimeout, "fabric: interrupted");
  }
  if (events_.empty()) return Status(Code::kTimeout, "fabric: nothing received within " + Ms(timeout));
  Event e = std::move(events_.front());
  events_.pop_front();
  --events_pending_;
  return e;
}

void RdmEndpoint::Interrupt() {
  std::lock_guard<std::mutex> lock(events_mu_);
  interrupted_ = true;
  events_cv_.notify_all();
}

void RdmEndpoint::Push(Event e) {
  std::lock_guard<std::mutex> lock(events_mu_);
  events_.push_back(std::move(e));
  ++events_pending_;
  events_cv_.notify_one();
}

void RdmEndpoint::OnReceive(RecvSlot* slot, size_t len) {
  const uint8_t* data = slot->buf.data.get();
  auto h = wire::DecodeHeader(data, len);
  const uint8_t* payload = data + wire::kHeaderSize;
  size_t plen = len - wire::kHeaderSize;
  if (!h) {
    log::Debug("fabric: dropped a malformed message of {} bytes", len);
  } else if (h->type == wire::Type::kConnect) {
    OnConnect(*h, payload, plen);
  } else {
    auto it = by_conn_id_.find(h->conn_id);
    Conn* c = it == by_conn_id_.end() ? nullptr : FindConn(it->second);
    if (c == nullptr) {
      log::Debug("fabric: dropped a message for unknown connection {:#x}", h->conn_id);
    } else if (h->type == wire::Type::kConnectAck && c->state == Conn::State::kConnecting) {
      auto ack = wire::DecodeConnectAck(payload, plen);
      c->state = ack && !ack->refused ? Conn::State::kUp : Conn::State::kFailed;
      if (c->state == Conn::State::kFailed) {
        c->failure = Status::Protocol("fabric: " + c->name + " refused the connection: " +
                                      (ack ? ack->reason : std::string("malformed answer")));
      }
      cv_.notify_all();
    } else if (h->type == wire::Type::kData && c->state == Conn::State::kUp) {
      OnData(*c, *h, payload, plen);
    } else if (h->type == wire::Type::kBye) {
      PeerFailed(c->id, Status(Code::kLinkLost, "closed the connection"));
    } else {
      log::Debug("fabric: dropped a message of type {} on {:#x}", static_cast<int>(h->type), h->conn_id);
    }
  }
  Repost(slot);
}

void RdmEndpoint::OnConnect(const wire::Header& h, const uint8_t* payload, size_t len) {
  if (!listening_) {
    log::Debug("fabric: dropped CONNECT {:#x}: this endpoint does not listen", h.conn_id);
    return;
  }
  auto req = wire::DecodeConnect(payload, len);
  if (!req) {
    log::Debug("fabric: dropped a malformed CONNECT");
    return;
  }
  wire::Header ack_h;
  ack_h.type = wire::Type::kConnectAck;
  ack_h.conn_id = h.conn_id;
  // A repeated CONNECT (same id) gets the same answer again.
  if (auto it = by_conn_id_.find(h.conn_id); it != by_conn_id_.end()) {
    Conn* c = FindConn(it->second);
    QueueControl(c->addr, c->id, ack_h, wire::EncodeConnectAck({}));
    return;
  }
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int r = fi_av_insert(h_->av, req->address.data(), 1, &addr, 0, nullptr);
  if (r != 1) {
    log::Warn("fabric: cannot insert a connecting peer's address: {}", fi_strerror(r < 0 ? -r : FI_EADDRNOTAVAIL));
    return;
  }
  char text[256];
  size_t text_len = sizeof(text);
  fi_av_straddr(h_->av, req->address.data(), text, &text_len);
  auto c = std::make_unique<Conn>();
  c->id = next_peer_++;
  c->conn_id = h.conn_id;
  c->addr = addr;
  c->name = text;
  c->state = Conn::State::kUp;
  // Different stacks cannot talk to each other reliably (FABRIC-NOTES: rxm 1.17 vs tcp 1.18).
  wire::ConnectAck ack;
  if (req->provider != provider_) {
    ack.refused = 1;
    ack.reason = "provider " + req->provider + " here is " + provider_;
    c->state = Conn::State::kFailed;
    log::Warn("fabric: refused {}: {}", c->name, ack.reason);
  } else if (req->fi_version != fi_version()) {
    log::Info("fabric: peer {} runs libfabric {}.{}, we run {}", c->name, FI_MAJOR(req->fi_version),
              FI_MINOR(req->fi_version), LibfabricVersion());
  }
  log::Debug("fabric: peer {} connected from {} ({:#x})", c->id, c->name, c->conn_id);
  QueueControl(addr, c->id, ack_h, wire::EncodeConnectAck(ack));
  by_conn_id_[c->conn_id] = c->id;
  peers_[c->id] = std::move(c);
}

void RdmEndpoint::OnData(Conn& c, const wire::Header& h, const uint8_t* payload, size_t len) {
  std::vector<std::vector<uint8_t>> due;
  Status st = c.inbound.Add(h, payload, len, &due);
  for (auto& m : due) Push(Event{EventKind::kMessage, c.id, std::move(m), {}});
  if (!st.ok()) {
    // Whatever it sends next cannot be trusted either: the link ends, and what it held goes.
    log::Warn("fabric: peer {} broke the protocol: {}", c.name, st.message());
    c.inbound.Clear();
    PeerFailed(c.id, Status::Protocol("fabric: " + st.message()));
  }
}

void RdmEndpoint::QueueControl(fi_addr_t addr, PeerId peer, const wire::Header& h, const std::vector<uint8_t>& payload) {
  // Runs on the progress thread: it may not wait, so a busy provider defers the send.
  Buffer b;
  if (!free_buffers_.empty()) {
    b = std::move(free_buffers_.back());
    free_buffers_.pop_back();
  } else {
    auto nb = NewBuffer();
    if (!nb.ok()) {
      log::Error("fabric: no buffer for a control message: {}", nb.status().message());
      return;
    }
    b = std::move(*nb);
    ++buffers_total_;
  }
  auto op = std::make_unique<SendOp>();
  op->peer = peer;
  op->buf = std::move(b);
  wire::Header frame = h;
  frame.total_len = payload.size();
  wire::EncodeHeader(frame, op->buf.data.get());
  std::memcpy(op->buf.data.get() + wire::kHeaderSize, payload.data(), payload.size());
  op->len = wire::kHeaderSize + payload.size();
  op->addr = addr;
  control_deferred_.push_back(std::move(op));
  deferred_ = true;
}

ssize_t RdmEndpoint::PostSend(SendOp& op) {
  return InProvider(*h_, [&] { return fi_send(h_->ep, op.buf.data.get(), op.len, op.buf.desc, op.addr, &op.fi); });
}

ssize_t RdmEndpoint::PostRecv(RecvSlot& slot) {
  return InProvider(*h_, [&] {
    return fi_recv(h_->ep, slot.buf.data.get(), wire::kHeaderSize + max_message_, slot.buf.desc, FI_ADDR_UNSPEC,
                   &slot.fi);
  });
}

void RdmEndpoint::Repost(RecvSlot* slot) {
  ssize_t r = PostRecv(*slot);
  if (r == -FI_EAGAIN) {
    recv_deferred_.push_back(slot);
    deferred_ = true;
  } else if (r != 0) {
    log::Error("fabric: fi_recv: {}; one receive buffer fewer", fi_strerror(static_cast<int>(-r)));
  }
}

}  // namespace tandem::fabric
