#include "peer_link.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tandem/ir/codec.h"
#include "tandem/log.h"
#include "tandem/thread_name.h"

namespace tandem::server {
namespace {

// The PeerAbort that tells the other end of `transfer` why it failed here.
ir::PeerAbortReq AbortOf(uint64_t transfer, const Status& why) {
  return ir::PeerAbortReq{transfer, static_cast<uint32_t>(why.code()), why.message()};
}

}  // namespace

// The source side of one transfer: every chunk the backend fills goes to the puller.
class PeerSource final : public BulkIO {
 public:
  PeerSource(FabricPeerLink* link, fabric::PeerId to, uint64_t transfer, uint64_t size, bool rma = false)
      : link_(link), to_(to), transfer_(transfer), size_(size), rma_(rma) {}
  // A source that never got to Push (the backend failed before its read) still answers the
  // puller, which would otherwise wait for it as long as the session lives.
  ~PeerSource() override {
    if (!answered_)
      link_->SendAlone(to_, AbortOf(transfer_, Status(Code::kApiError, "the source server failed before it read the bytes")));
  }
  Status Pull(const ir::Region&, size_t, const std::function<Status(const uint8_t*, size_t, size_t)>&) override {
    return Status(Code::kInternal, "a server-to-server source only sends");
  }
  Status Push(const ir::Region&, size_t len,
              const std::function<Status(uint8_t* chunk, size_t offset, size_t n)>& source) override {
    if (len != size_) return Status(Code::kInternal, fmt::format("PeerSend of {} bytes asked for {}", size_, len));
    answered_ = true;  // from here on every failure sends its own PeerAbort
    if (rma_) {
      std::unique_lock<std::mutex> use(link_->source_ring_.use);
      Status ring = link_->Ring(link_->source_ring_, FabricPeerLink::kSlots, fabric::kRemoteRead);
      if (ring.ok()) {
        Status st = PushRegions(len, source);
        if (!st.ok())  // the puller fails at once instead of at its timeout
          link_->SendAlone(to_, AbortOf(transfer_, st));
        return st;
      }
      static std::once_flag once;
      std::call_once(once, [&] {
        log::Warn("PeerSend: cannot register the streaming ring for RMA ({}); sending chunks as messages",
                  ring.ToString());
      });
    }
    for (size_t offset = 0; offset < len;) {
      const size_t n = std::min(FabricPeerLink::kChunk, len - offset);
      // The backend fills the message itself: no copy between its read and the send.
      ir::BatchWriter w(ir::BatchKind::kRequests);
      uint8_t* into = w.AddRequestWithTail(ir::PeerDataReq{transfer_, offset, {}}, n, 0);
      if (Status st = source(into, offset, n); !st.ok()) {  // the puller fails at once
        link_->SendAlone(to_, AbortOf(transfer_, st));
        return st;
      }
      Status st = link_->endpoint_->Send(to_, w.Finish());
      if (!st.ok()) return Status(Code::kLinkLost, "PeerSend: the pulling server is gone: " + st.message());
      offset += n;
    }
    return Status::Ok();
  }

  private:
  // Each chunk is read from the device into a ring slot and offered as a PeerRegion; a slot is
  // refilled once the puller released what it held. Source ring lock held.
  Status PushRegions(size_t len, const std::function<Status(uint8_t* chunk, size_t offset, size_t n)>& source) {
    constexpr size_t kChunk = FabricPeerLink::kChunk, kSlots = FabricPeerLink::kSlots;
    FabricPeerLink::RingMemory& ring = link_->source_ring_;
    {
      std::lock_guard<std::mutex> lock(link_->mu_);
      link_->streams_[transfer_] = FabricPeerLink::Stream{to_};
    }
    const size_t chunks = (len + kChunk - 1) / kChunk;
    Status st;
    uint64_t sent = 0;
    for (size_t c = 0; c < chunks && st.ok(); ++c) {
      const size_t slot = c % kSlots, offset = c * kChunk, n = std::min(kChunk, len - offset);
      if (c >= kSlots) st = link_->AwaitReleases(transfer_, c - kSlots + 1);
      if (st.ok()) st = source(ring.bytes.get() + slot * kChunk, offset, n);
      if (st.ok() && !link_->SendAlone(to_, ir::PeerRegionReq{transfer_, offset,
                                                              ring.region->remote_addr() + slot * kChunk, n,
                                                              ring.region->key()}))
        st = Status(Code::kLinkLost, "PeerSend: the pulling server is gone");
      else if (st.ok())
        ++sent;
    }
    // Every slot must be read before the ring serves the next transfer.
    if (st.ok()) st = link_->AwaitReleases(transfer_, chunks);
    uint64_t released = 0;
    {
      std::lock_guard<std::mutex> lock(link_->mu_);
      released = link_->streams_[transfer_].released;
      link_->streams_.erase(transfer_);
    }
    // Regions the puller may still read are never refilled: the ring is retired (left as it
    // is, registered, a leak of its chunks) and the next transfer makes a new one.
    if (released < sent) {
      log::Warn("PeerSend: transfer {:#x} ended with {} of {} regions unreleased; its ring is retired", transfer_,
                sent - released, sent);
      (void)ring.bytes.release();
      (void)ring.region.release();
    }
    return st;
  }

  FabricPeerLink* link_;
  fabric::PeerId to_;
  uint64_t transfer_, size_;
  bool rma_;
  bool answered_ = false;
};

// The destination side: asks for the transfer on the first Pull, then hands chunks over in
// order as they arrive.
class PeerSink final : public BulkIO {
 public:
  PeerSink(FabricPeerLink* link, fabric::PeerId from, uint64_t transfer, uint64_t size)
      : link_(link), from_(from), transfer_(transfer), size_(size) {}
  ~PeerSink() override { link_->CloseInbox(transfer_); }
  Status Pull(const ir::Region&, size_t len,
              const std::function<Status(const uint8_t* chunk, size_t offset, size_t n)>& sink) override {
    if (len != size_) return Status(Code::kInternal, fmt::format("PeerRecv of {} bytes asked for {}", size_, len));
    std::unique_lock<std::mutex> use(link_->sink_ring_.use, std::defer_lock);
    bool rma = false;
    if (len >= FabricPeerLink::kRmaMinBytes) {
      use.lock();
      rma = link_->Ring(link_->sink_ring_, 2, fabric::kLocal).ok();
      if (!rma) use.unlock();
    }
    TANDEM_RETURN_IF_ERROR(link_->SendPull(from_, transfer_, size_, rma));
    rma_ = rma;
    Status st = Receive(len, sink);
    // A streaming source waits for the releases of its ring: it hears at once instead.
    if (!st.ok() && rma)
      link_->SendAlone(from_, AbortOf(transfer_, st));
    // A read still in flight after a failure may write into the ring later: it is retired,
    // never reused (a leak of two chunks, only when a read outlived its timeout).
    if (posted_) (void)link_->endpoint_->Wait(*posted_, link_->timeout_);
    if (posted_ && link_->endpoint_->InFlight(*posted_)) {
      log::Warn("PeerRecv: an RMA read of transfer {:#x} outlived its timeout; its staging is retired", transfer_);
      (void)link_->sink_ring_.bytes.release();
      (void)link_->sink_ring_.region.release();
    }
    return st;
  }
  Status Push(const ir::Region&, size_t, const std::function<Status(uint8_t*, size_t, size_t)>&) override {
    return Status(Code::kInternal, "a server-to-server sink only receives");
  }

 private:
  // Bytes [offset, +n) of the transfer: in a message, or read by RMA into ring slot `slot`.
  struct Piece {
    uint64_t offset = 0;
    size_t n = 0;
    const uint8_t* data = nullptr;
    std::shared_ptr<const std::vector<uint8_t>> message;  // keeps `data` alive
    std::optional<fabric::OpId> read;
    bool last_of_region = false;  // its region is released once it is read
  };

  // The next piece in order: the rest of the current region (at most a chunk, read into `slot`),
  // or the next chunk that came.
  Result<Piece> Next(size_t len, int slot) {
    if (!region_ || region_pos_ == region_->len) {
      region_.reset();
      auto chunk = link_->NextChunk(transfer_);
      if (!chunk.ok()) return chunk.status();
      FabricPeerLink::Chunk& c = chunk.value();
      if (c.offset != queued_ || c.len == 0 || c.len > len - queued_)
        return Status::Protocol(fmt::format("{} of transfer {:#x}: bytes [{}, +{}) where [{}, ...) of {} was due",
                                            c.remote ? "PeerRegion" : "PeerData", transfer_, c.offset, c.len, queued_,
                                            len));
      if (c.remote && !rma_)
        return Status::Protocol(fmt::format("PeerRegion of transfer {:#x}, which was pulled without RMA", transfer_));
      // Regions come whole (a lent copy) or a chunk at a time (a ring): nothing smaller.
      if (c.remote && c.len != len - queued_ && c.len != FabricPeerLink::kChunk)
        return Status::Protocol(fmt::format("PeerRegion of transfer {:#x}: {} bytes, neither the rest nor a chunk",
                                            transfer_, c.len));
      queued_ += c.len;
      if (!c.remote) return Piece{c.offset, c.len, c.data(), c.message, std::nullopt, false};
      region_ = std::move(c);
      region_pos_ = 0;
    }
    FabricPeerLink::RingMemory& ring = link_->sink_ring_;
    const size_t n = std::min<size_t>(FabricPeerLink::kChunk, region_->len - region_pos_);
    auto op = link_->endpoint_->PostRead(from_, *ring.region, slot * FabricPeerLink::kChunk, region_->region,
                                         region_pos_, n);
    if (!op.ok()) return Status(Code::kLinkLost, "PeerRecv: cannot read the source's bytes: " + op.status().message());
    posted_ = op.value();
    Piece p{region_->offset + region_pos_, n, ring.bytes.get() + slot * FabricPeerLink::kChunk, nullptr, op.value(),
            false};
    region_pos_ += n;
    p.last_of_region = region_pos_ == region_->len;
    return p;
  }

  Status Receive(size_t len, const std::function<Status(const uint8_t* chunk, size_t offset, size_t n)>& sink) {
    int slot = 0;
    auto p = Next(len, slot);
    if (!p.ok()) return p.status();
    if (p->read) slot ^= 1;
    for (size_t written = 0;;) {
      if (p->read) {
        Status st = link_->endpoint_->Wait(*p->read, link_->timeout_);
        if (!st.ok()) return Status(Code::kLinkLost, "PeerRecv: reading the source's bytes failed: " + st.message());
        posted_.reset();
        link_->rma_reads_.fetch_add(1);
        if (p->last_of_region) link_->SendAlone(from_, ir::PeerReleaseReq{transfer_});
      }
      // The next read is on the wire while this piece goes to the device.
      std::optional<Piece> q;
      if (written + p->n < len) {
        auto next = Next(len, slot);
        if (!next.ok()) return next.status();
        if (next->read) slot ^= 1;
        q = std::move(next).value();
      }
      TANDEM_RETURN_IF_ERROR(sink(p->data, p->offset, p->n));
      written += p->n;
      if (!q) return Status::Ok();
      p = std::move(*q);
    }
  }

  FabricPeerLink* link_;
  fabric::PeerId from_;
  uint64_t transfer_, size_;
  uint64_t queued_ = 0;  // bytes of the chunks taken from the inbox
  std::optional<FabricPeerLink::Chunk> region_;  // the remote chunk being read, and how far
  uint64_t region_pos_ = 0;
  std::optional<fabric::OpId> posted_;  // the last read posted and not waited for yet
  bool rma_ = false;                    // pulled with PeerPullRma
};

void FabricPeerLink::Outcome::Finish(const Status& st) {
  std::function<void(const Status&)> fn;
  {
    std::lock_guard<std::mutex> lock(m);
    if (finished) return;
    finished = true;
    fn = std::move(done);
  }
  if (fn) fn(st);
}

void FabricPeerLink::Outcome::Read(uint64_t n) {
  {
    std::lock_guard<std::mutex> lock(m);
    if (finished) return;
    read += n;
    if (read < size) return;
  }
  Finish(Status::Ok());
}

Status FabricPeerLink::Ring(RingMemory& ring, size_t slots, uint32_t access) {
  if (ring.region) return Status::Ok();
  if (!ring.bytes) ring.bytes = std::make_unique_for_overwrite<uint8_t[]>(slots * kChunk);
  auto region = endpoint_->Register(ring.bytes.get(), slots * kChunk, access);
  if (!region.ok()) return region.status();
  ring.region = std::move(region).value();
  return Status::Ok();
}

void FabricPeerLink::Failed(uint64_t transfer, const Status& why) {
  if (failed_.size() >= kMaxPendingPulls) {
    failed_.erase(failed_order_.front());
    failed_order_.pop_front();
  }
  if (failed_.emplace(transfer, why).second) failed_order_.push_back(transfer);
}

Status FabricPeerLink::AwaitReleases(uint64_t transfer, uint64_t count) {
  std::unique_lock<std::mutex> lock(mu_);
  Stream& s = streams_[transfer];
  if (!cv_.wait_for(lock, timeout_, [&] { return s.released >= count || !s.failed.ok(); }))
    return Status(Code::kTimeout, fmt::format("PeerSend: the puller of transfer {:#x} read nothing for {} ms", transfer,
                                              timeout_.count()));
  return s.failed;
}

FabricPeerLink::FabricPeerLink(fabric::Endpoint* endpoint, fabric::Millis timeout)
    : endpoint_(endpoint), timeout_(timeout), sender_([this] { NameThisThread("tdm-peer-send"); SendLoop(); }),
      reader_([this] { NameThisThread("tdm-peer-read"); ReadLoop(); }) {}

FabricPeerLink::~FabricPeerLink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  sender_.join();
  reader_.join();
}

void FabricPeerLink::Offer(uint64_t transfer, uint64_t size, Result<std::shared_ptr<HostBuffer>> bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto pull = pulls_.find(transfer); pull != pulls_.end()) {
    const Pull p = pull->second;
    pulls_.erase(pull);
    QueueSend(p.peer, transfer, size, p.size, std::move(bytes), p.rma);
    return;
  }
  offers_[transfer] = Offered{size, std::move(bytes)};
}

void FabricPeerLink::QueueSend(fabric::PeerId to, uint64_t transfer, uint64_t size, uint64_t pulled,
                               Result<std::shared_ptr<HostBuffer>> bytes, bool rma) {
  if (pulled != size)
    bytes = Status::Invalid(
        fmt::format("PeerSend: transfer {:#x} is {} bytes here, the puller asked for {}", transfer, size, pulled));
  else if (bytes.ok() && bytes.value()->size() < size)
    bytes = Status(Code::kInternal, fmt::format("PeerSend: a {}-byte buffer for a {}-byte transfer",
                                                bytes.value()->size(), size));
  sends_.push_back(SendJob{to, transfer, std::move(bytes), rma});
  cv_.notify_all();
}

Status FabricPeerLink::Expect(const std::string& peer, uint64_t transfer, std::shared_ptr<HostBuffer> into,
                              std::function<void(const Status&)> done) {
  if (peer == endpoint_->address())
    return Status::Invalid("PeerRecv: the source is this session itself; copy within the session instead");
  auto from = ConnectTo(peer);
  if (!from.ok()) return from.status();
  const uint64_t size = into->size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (expected_.contains(transfer) || inboxes_.contains(transfer))
      return Status::Invalid(fmt::format("PeerRecv: transfer {:#x} is already being received", transfer));
    expected_[transfer] = Expected{from.value(), std::move(into), 0, std::move(done), nullptr};
  }
  Status st = SendPull(from.value(), transfer, size, /*rma=*/size >= kRmaMinBytes);
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    expected_.erase(transfer);  // the caller fails the write with `st`
  }
  return st;
}

void FabricPeerLink::SendLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_ || !sends_.empty(); });
    if (stopping_) return;
    while (!sends_.empty()) {
      SendJob job = std::move(sends_.front());
      sends_.pop_front();
      ++busy_;
      lock.unlock();
      SendTransfer(job);
      lock.lock();
      if (--busy_ == 0) cv_.notify_all();
    }
    // No deadlines here: a source may be far behind its puller (or ahead of it) because its
    // own stream is busy, for as long as the program keeps it busy. A lost link fails what
    // depends on it (OnPeerLost), and a source that fails says so (PeerAbort).
  }
}

void FabricPeerLink::SendTransfer(const SendJob& job) {
  if (!job.bytes.ok()) {
    SendAlone(job.to, AbortOf(job.transfer, job.bytes.status()));
    return;
  }
  if (job.rma && Lend(job)) return;
  // The same chunks as a transfer through the executor, filled from the host buffer.
  HostBuffer& bytes = *job.bytes.value();
  PeerSource source(this, job.to, job.transfer, bytes.size());
  Status st = source.Push({}, bytes.size(), [&](uint8_t* chunk, size_t offset, size_t n) {
    std::memcpy(chunk, bytes.data() + offset, n);
    return Status::Ok();
  });
  // The puller sees the link go.
  if (!st.ok()) log::Warn("PeerSend: transfer {:#x} cut: {}", job.transfer, st.ToString());
}

bool FabricPeerLink::Lend(const SendJob& job) {
  const std::shared_ptr<HostBuffer>& bytes = job.bytes.value();
  auto region = endpoint_->Register(bytes->data(), bytes->size(), fabric::kRemoteRead);
  if (!region.ok()) {
    static std::once_flag once;
    std::call_once(once, [&] {
      log::Warn("PeerSend: cannot register a transfer's bytes for RMA ({}); sending them as messages",
                region.status().ToString());
    });
    return false;
  }
  const ir::PeerRegionReq answer{job.transfer, 0, region.value()->remote_addr(), bytes->size(), region.value()->key()};
  Lent lend{job.to, bytes, std::move(region).value()};
  bool reused = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A reused id: the copy lent first may still be read, so it stays as it is (and this one
    // is deregistered on return, outside the lock).
    reused = !lent_.try_emplace(job.transfer, std::move(lend)).second;
  }
  if (reused) {
    SendAlone(job.to, AbortOf(job.transfer, Status::Invalid("the transfer id is already in use")));
    return true;
  }
  if (!SendAlone(job.to, answer)) {  // the puller is gone: so are its reads
    Lent gone;
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = lent_.find(job.transfer); it != lent_.end()) {
      gone = std::move(it->second);
      lent_.erase(it);
    }
  }
  return true;
}

bool FabricPeerLink::WaitIdle(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, limit, [this] { return sends_.empty() && reads_.empty() && busy_ == 0; });
}

void FabricPeerLink::ReadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_ || !reads_.empty(); });
    if (stopping_) return;
    while (!reads_.empty()) {
      ReadJob job = std::move(reads_.front());
      reads_.pop_front();
      ++busy_;
      lock.unlock();
      ReadTransfer(job);
      lock.lock();
      if (--busy_ == 0) cv_.notify_all();
    }
    // Reads that outlived their transfer: their memory goes once the provider is done.
    std::erase_if(stuck_, [&](StuckRead& r) { return !endpoint_->InFlight(r.op); });
  }
}

void FabricPeerLink::ReadTransfer(ReadJob& job) {
  const size_t size = job.region.len;
  Status st;
  if (job.outcome->over()) {  // an earlier region of it failed, or it timed out
    SendAlone(job.from, ir::PeerReleaseReq{job.transfer});
    return;
  }
  auto region = endpoint_->Register(job.into->data() + job.offset, size, fabric::kLocal);
  st = region.status();
  if (st.ok()) {
    auto op = endpoint_->PostRead(job.from, *region.value(), 0, job.region, 0, size);
    st = op.status();
    if (op.ok()) {
      st = endpoint_->Wait(op.value(), timeout_);
      if (!st.ok() && endpoint_->InFlight(op.value())) {  // the provider may still write there
        std::lock_guard<std::mutex> lock(mu_);
        stuck_.push_back(StuckRead{op.value(), std::move(region).value(), job.into});
      }
    }
  }
  SendAlone(job.from, ir::PeerReleaseReq{job.transfer});
  if (st.ok()) {
    rma_reads_.fetch_add(1);
    job.outcome->Read(size);
    return;
  }
  log::Warn("PeerRecv: transfer {:#x}: reading {} bytes at {} from the source failed: {}", job.transfer, size,
            job.offset, st.ToString());
  job.outcome->Finish(Status(st.code() == Code::kTimeout ? Code::kTimeout : Code::kLinkLost,
                             "PeerRecv: reading the source server's bytes failed: " + st.message()));
}

Result<std::unique_ptr<BulkIO>> FabricPeerLink::Source(uint64_t transfer, uint64_t size) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool pulled = cv_.wait_for(lock, timeout_, [&] { return pulls_.contains(transfer); });
  if (!pulled) {
    const Status st(Code::kTimeout,
                    fmt::format("PeerSend: no server pulled transfer {:#x} within {} ms", transfer, timeout_.count()));
    Failed(transfer, st);  // a pull that comes later is answered with this
    return st;
  }
  Pull pull = pulls_[transfer];
  pulls_.erase(transfer);
  if (pull.size != size) {
    const Status st = Status::Invalid(
        fmt::format("PeerSend: transfer {:#x} is {} bytes here, the puller asked for {}", transfer, size, pull.size));
    // The puller hears it, as from QueueSend: an asynchronous one would otherwise wait for ever.
    lock.unlock();
    SendAlone(pull.peer, AbortOf(transfer, st));
    return st;
  }
  return std::unique_ptr<BulkIO>(new PeerSource(this, pull.peer, transfer, size, pull.rma));
}

Result<std::unique_ptr<BulkIO>> FabricPeerLink::Sink(const std::string& peer, uint64_t transfer, uint64_t size) {
  if (peer == endpoint_->address())
    return Status::Invalid("PeerRecv: the source is this session itself; copy within the session instead");
  auto from = ConnectTo(peer);
  if (!from.ok()) return from.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inboxes_.contains(transfer)) return Status::Invalid(fmt::format("PeerRecv: transfer {:#x} is already being received", transfer));
    inboxes_[transfer].from = from.value();
  }
  return std::unique_ptr<BulkIO>(new PeerSink(this, from.value(), transfer, size));
}

template <class Req>
bool FabricPeerLink::SendAlone(fabric::PeerId peer, const Req& req) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  w.AddRequest(req, 0);
  Status st = endpoint_->Send(peer, w.Finish());
  if (!st.ok()) log::Warn("{} to a peer server not sent: {}", Req::kName, st.ToString());
  return st.ok();
}

void FabricPeerLink::ExportDone(uint64_t token, int32_t status) {
  std::optional<fabric::PeerId> watcher;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = exports_.find(token);
    if (it == exports_.end()) {
      if (exports_.size() >= kMaxPendingExports) {
        log::Warn("exported event {:#x} finished, but {} others wait for their watchers: dropped", token,
                  exports_.size());
        return;
      }
      it = exports_.emplace(token, Exported{}).first;
    }
    if (it->second.done) return;  // told once
    watcher = it->second.watcher;
    if (watcher) {
      exports_.erase(it);
    } else {
      it->second.done = true;
      it->second.status = status;
    }
  }
  if (watcher) SendAlone(*watcher, ir::PeerSignalReq{token, status});
}

Status FabricPeerLink::Import(const std::string& peer, uint64_t token, std::function<void(int32_t status)> done) {
  if (peer == endpoint_->address()) return Status::Invalid("EventImport: the event is this session's own");
  auto from = ConnectTo(peer);
  if (!from.ok()) return from.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (imports_.contains(token)) return Status::Invalid(fmt::format("EventImport: token {:#x} is already imported", token));
    imports_[token] = Imported{from.value(), std::move(done)};
  }
  if (SendAlone(from.value(), ir::PeerWatchReq{token})) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  imports_.erase(token);
  return Status(Code::kLinkLost, "EventImport: cannot reach the server of the event");
}

Result<fabric::PeerId> FabricPeerLink::ConnectTo(const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = connections_.find(peer); it != connections_.end()) return it->second;
  }
  auto id = endpoint_->Connect(peer, timeout_);
  if (!id.ok()) return Status(id.status().code(), "PeerRecv: cannot reach the source server: " + id.status().message());
  std::lock_guard<std::mutex> lock(mu_);
  connections_[peer] = id.value();
  outgoing_.insert(id.value());
  return id.value();
}

Status FabricPeerLink::SendPull(fabric::PeerId peer, uint64_t transfer, uint64_t size, bool rma) {
  ir::BatchWriter w(ir::BatchKind::kRequests);
  if (rma) w.AddRequest(ir::PeerPullRmaReq{transfer, size}, 0);
  else w.AddRequest(ir::PeerPullReq{transfer, size}, 0);
  Status st = endpoint_->Send(peer, w.Finish());
  if (!st.ok()) return Status(Code::kLinkLost, "PeerRecv: cannot ask the source server: " + st.message());
  return st;
}

Result<FabricPeerLink::Chunk> FabricPeerLink::NextChunk(uint64_t transfer) {
  std::unique_lock<std::mutex> lock(mu_);
  Inbox& in = inboxes_[transfer];
  const bool ready = cv_.wait_for(lock, timeout_, [&] { return !in.chunks.empty() || !in.failed.ok(); });
  if (!in.chunks.empty()) {
    auto chunk = std::move(in.chunks.front());
    in.chunks.pop_front();
    return chunk;
  }
  if (!ready) return Status(Code::kTimeout, fmt::format("PeerRecv: transfer {:#x} stalled for {} ms", transfer, timeout_.count()));
  return in.failed;
}

void FabricPeerLink::CloseInbox(uint64_t transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  inboxes_.erase(transfer);
}

bool FabricPeerLink::OnMessage(fabric::PeerId peer, std::vector<uint8_t>&& message) {
  std::vector<ir::Record> records;
  Status st = ir::ParseBatch(message, ir::BatchKind::kRequests, &records);
  if (!st.ok() || records.empty()) {
    OnPeerLost(peer, Status(Code::kProtocol, "it sent a malformed server-to-server message"));
    return false;
  }
  // A chunk keeps the message it came in (one PeerData per message): its bytes are not copied.
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(message));
  // Done once the lock is released: answers to watches, and imported events' outcomes.
  Deferred after;
  bool ok = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const ir::Record& rec : records)
      if (!(ok = TakeRecord(peer, rec, owner, &after))) break;
    cv_.notify_all();
  }
  for (const auto& c : after.copies) std::memcpy(c.to, c.from, c.n);
  for (const auto& answer : after.answers) SendAlone(peer, answer);
  for (uint64_t transfer : after.releases) SendAlone(peer, ir::PeerReleaseReq{transfer});
  for (const auto& abort : after.aborts) SendAlone(peer, abort);
  after.released.clear();
  for (auto& [done, status] : after.outcomes) done(status);
  for (auto& [done, status] : after.finished) done(status);
  // The caller refuses the peer and closes its connection, which raises no kPeerLost here:
  // what waits on that peer fails now instead of for ever.
  if (!ok) OnPeerLost(peer, Status(Code::kProtocol, "it sent a malformed or unexpected server-to-server message"));
  return ok;
}

bool FabricPeerLink::TakeRecord(fabric::PeerId peer, const ir::Record& rec,
                                const std::shared_ptr<const std::vector<uint8_t>>& owner, Deferred* after) {
  switch (static_cast<ir::Opcode>(rec.header.opcode)) {
    case ir::Opcode::kPeerPull:
    case ir::Opcode::kPeerPullRma: {
      const bool rma = static_cast<ir::Opcode>(rec.header.opcode) == ir::Opcode::kPeerPullRma;
      ir::PeerPullReq pull;  // PeerPullRma has the same fields
      if (!ir::DecodeRequest(rec.payload, &pull).ok()) return false;
      if (auto f = failed_.find(pull.transfer); f != failed_.end()) {  // it failed here already
        after->aborts.push_back(AbortOf(pull.transfer, f->second));
        return true;
      }
      if (auto o = offers_.find(pull.transfer); o != offers_.end()) {  // read already: send it
        QueueSend(peer, pull.transfer, o->second.size, pull.size, std::move(o->second.bytes), rma);
        offers_.erase(o);
        return true;
      }
      if (pulls_.size() >= kMaxPendingPulls) {
        after->aborts.push_back(
            AbortOf(pull.transfer, Status(Code::kOverload, "too many pulls wait for their PeerSend here")));
        return true;
      }
      pulls_[pull.transfer] = Pull{peer, pull.size, rma};
      return true;
    }
    case ir::Opcode::kPeerRegion: {
      ir::PeerRegionReq region;
      if (!ir::DecodeRequest(rec.payload, &region).ok()) return false;
      const fabric::RemoteRegion remote{region.addr, region.len, region.key};
      if (auto e = expected_.find(region.transfer); e != expected_.end() && e->second.from == peer) {
        TakeRegion(peer, region.transfer, region.offset, remote, after);
        return true;
      }
      // A transfer the executor pulls: its sink reads the region.
      auto in = inboxes_.find(region.transfer);
      if (outgoing_.contains(peer) && in != inboxes_.end() && in->second.from == peer) {
        in->second.chunks.push_back(Chunk{region.offset, nullptr, 0, region.len, true, remote});
        return true;
      }
      // Timed out here already, or never asked for: the source may let the bytes go.
      log::Warn("PeerRegion for transfer {:#x} nobody here waits for from that peer: released", region.transfer);
      after->releases.push_back(region.transfer);
      return true;
    }
    case ir::Opcode::kPeerRelease: {
      ir::PeerReleaseReq release;
      if (!ir::DecodeRequest(rec.payload, &release).ok()) return false;
      auto it = lent_.find(release.transfer);
      if (it == lent_.end() || it->second.to != peer) {
        if (auto s = streams_.find(release.transfer); s != streams_.end() && s->second.to == peer) {
          ++s->second.released;  // a ring slot is free again
          return true;
        }
        log::Warn("PeerRelease for transfer {:#x} that peer was not lent: ignored", release.transfer);
        return true;
      }
      after->released.push_back(std::move(it->second));
      lent_.erase(it);
      return true;
    }
    case ir::Opcode::kPeerAbort: {
      ir::PeerAbortReq abort;
      if (!ir::DecodeRequest(rec.payload, &abort).ok()) return false;
      const Status why(Code::kApiError, "the source server could not read the bytes: " + abort.message);
      // From the puller: it gave up on a transfer this worker streams or lends to it.
      if (auto s = streams_.find(abort.transfer); s != streams_.end() && s->second.to == peer) {
        s->second.failed = Status(Code::kApiError, "the pulling server gave up the transfer: " + abort.message);
        return true;
      }
      if (auto l = lent_.find(abort.transfer); l != lent_.end() && l->second.to == peer) {
        after->released.push_back(std::move(l->second));
        lent_.erase(l);
        return true;
      }
      auto it = expected_.find(abort.transfer);
      if (it == expected_.end() || it->second.from != peer) {
        auto in = inboxes_.find(abort.transfer);
        if (in != inboxes_.end() && in->second.from == peer) in->second.failed = why;
        return true;
      }
      after->finished.emplace_back(it->second.Ender(), why);
      expected_.erase(it);
      return true;
    }
    case ir::Opcode::kPeerData: {
      // PeerDataReq{transfer, offset, data} read in place.
      ir::Reader r(rec.payload);
      uint64_t transfer, offset;
      uint32_t n;
      if (!r.GetInt(&transfer) || !r.GetInt(&offset) || !r.GetCount(&n, ir::kMaxBytes, 1) || r.remaining() != n)
        return false;
      if (auto e = expected_.find(transfer); e != expected_.end()) {
        Expected& x = e->second;
        // Only from the worker this one asked, in order, within the transfer.
        if (x.from != peer) {
          log::Warn("PeerData for transfer {:#x} from a peer not asked for it: dropped", transfer);
          return true;
        }
        if (offset != x.received || n > x.into->size() - x.received || x.outcome) {
          after->finished.emplace_back(
              x.Ender(), Status::Protocol(fmt::format("PeerData of transfer {:#x}: bytes [{}, +{}) where "
                                                              "[{}, ...) of {} was due",
                                                              transfer, offset, n, x.received, x.into->size())));
          expected_.erase(e);
          return true;
        }
        const size_t at = static_cast<size_t>(r.cursor() - owner->data());
        after->copies.push_back(Deferred::Copy{x.into, x.into->data() + offset, owner, owner->data() + at, n});
        x.received += n;
        if (x.received == x.into->size()) {
          after->finished.emplace_back(std::move(x.done), Status::Ok());
          expected_.erase(e);
        }
        return true;
      }
      // Only from a worker this one asked, for a transfer it is receiving from that worker.
      auto it = inboxes_.find(transfer);
      if (!outgoing_.contains(peer) || it == inboxes_.end() || it->second.from != peer) {
        log::Warn("PeerData for transfer {:#x} nobody here asked that peer for: dropped", transfer);
        return true;
      }
      const size_t at = static_cast<size_t>(r.cursor() - owner->data());
      it->second.chunks.push_back(Chunk{offset, owner, at, n});
      return true;
    }
    case ir::Opcode::kPeerWatch: {
      ir::PeerWatchReq watch;
      if (!ir::DecodeRequest(rec.payload, &watch).ok()) return false;
      auto it = exports_.find(watch.token);
      if (it == exports_.end()) {
        if (exports_.size() >= kMaxPendingExports) return false;
        exports_[watch.token].watcher = peer;  // not exported yet: answered by ExportDone
      } else if (it->second.watcher) {
        return false;  // one watcher per token
      } else if (it->second.done) {
        after->answers.push_back(ir::PeerSignalReq{watch.token, it->second.status});
        exports_.erase(it);
      } else {
        it->second.watcher = peer;
      }
      return true;
    }
    case ir::Opcode::kPeerSignal: {
      ir::PeerSignalReq signal;
      if (!ir::DecodeRequest(rec.payload, &signal).ok()) return false;
      // Only from the worker this one asked.
      auto it = imports_.find(signal.token);
      if (it == imports_.end() || it->second.from != peer) {
        log::Warn("PeerSignal for token {:#x} nobody here asked that peer for: dropped", signal.token);
        return true;
      }
      after->outcomes.emplace_back(std::move(it->second.done), signal.status);
      imports_.erase(it);
      return true;
    }
    default:
      return false;
  }
}

void FabricPeerLink::TakeRegion(fabric::PeerId peer, uint64_t transfer, uint64_t offset,
                                const fabric::RemoteRegion& region, Deferred* after) {
  auto e = expected_.find(transfer);
  Expected& x = e->second;
  const uint64_t size = x.into->size();
  // In order, within the transfer, and not after bytes that came as messages.
  // In order, whole (a lent copy) or a chunk at a time (a ring): nothing smaller.
  const bool shape = region.len == size - x.received || (region.len == kChunk && region.len < size - x.received);
  if (offset != x.received || !shape || (x.received && !x.outcome)) {
    after->finished.emplace_back(
        x.Ender(), Status::Protocol(fmt::format("PeerRegion of transfer {:#x}: bytes [{}, +{}) where [{}, ...) of {} "
                                                "was due",
                                                transfer, offset, region.len, x.received, size)));
    after->releases.push_back(transfer);
    expected_.erase(e);
    return;
  }
  if (!x.outcome) {
    x.outcome = std::make_shared<Outcome>();
    x.outcome->done = std::move(x.done);
    x.outcome->size = size;
  }
  reads_.push_back(ReadJob{peer, transfer, region, x.into, offset, x.outcome});
  x.received += region.len;
  if (x.received == size) expected_.erase(e);  // the reads end it now
}

// The `done` of every entry from `peer`, taken out of the table.
template <class Table>
auto FabricPeerLink::TakeFrom(Table& table, fabric::PeerId peer) {
  std::vector<decltype(table.begin()->second.done)> taken;
  for (auto it = table.begin(); it != table.end();) {
    if (it->second.from == peer) {
      taken.push_back(std::move(it->second.done));
      it = table.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

void FabricPeerLink::OnPeerLost(fabric::PeerId peer, const Status& why) {
  std::unique_lock<std::mutex> lock(mu_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second == peer) it = connections_.erase(it);
    else ++it;
  }
  outgoing_.erase(peer);
  for (auto& [transfer, in] : inboxes_)
    if (in.from == peer) in.failed = Status(Code::kLinkLost, "the source server of a copy was lost: " + why.message());
  std::erase_if(pulls_, [&](const auto& p) { return p.second.peer == peer; });
  std::erase_if(exports_, [&](const auto& e) { return e.second.watcher == peer; });
  std::erase_if(sends_, [&](const SendJob& j) { return j.to == peer; });
  std::vector<Lent> unlent;
  for (auto it = lent_.begin(); it != lent_.end();) {
    if (it->second.to == peer) {
      unlent.push_back(std::move(it->second));
      it = lent_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [transfer, stream] : streams_)
    if (stream.to == peer) stream.failed = Status(Code::kLinkLost, "the pulling server was lost: " + why.message());
  std::vector<std::function<void(const Status&)>> cut;
  for (auto it = expected_.begin(); it != expected_.end();) {
    if (it->second.from == peer) {
      cut.push_back(it->second.Ender());
      it = expected_.erase(it);
    } else {
      ++it;
    }
  }
  // Whatever waits on that worker's events fails instead of waiting for ever.
  auto lost = TakeFrom(imports_, peer);
  cv_.notify_all();
  lock.unlock();
  unlent.clear();
  for (auto& done : lost) done(-(ir::kEventFailedTandem + static_cast<int32_t>(Code::kServerLost)));
  for (auto& done : cut) done(Status(Code::kLinkLost, "the source server of a copy was lost: " + why.message()));
}

}  // namespace tandem::server
