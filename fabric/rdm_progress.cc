// The progress thread. Manual-progress providers (rxm, shm) move nothing, not even the target
// side of an RMA, unless someone polls, so it always runs: it reads the CQ, spinning for
// spin_us after activity (or while a caller waits on the provider), then blocking. While a
// caller spins in Next() it reads the CQ itself (the message it waits for then needs no
// hand-over between threads) and this thread stays off the CQ and the provider's locks.
#include <rdma/fi_errno.h>

#include <unordered_set>

#include "rdm_endpoint.h"
#include "tandem/log.h"
#include "tandem/spin.h"

namespace tandem::fabric {
namespace {

constexpr int kBlockMs = 50;                        // longest sleep in fi_cq_sread
constexpr auto kNap = std::chrono::microseconds(200);  // sleep when the CQ has no wait object
constexpr auto kCallerNap = std::chrono::microseconds(20);  // sleep while a caller reads the CQ

}  // namespace

void RdmEndpoint::Kick() { SignalCq(*h_); }

ssize_t RdmEndpoint::ReadCq(fi_cq_data_entry* entries, bool polite) {
  // seq_cst on both sides (posting_ then reading_ here, the reverse there): a reader and a
  // poster never both go ahead.
  if (polite && posting_.load() > 0) return -FI_EAGAIN;
  reading_.store(true);
  if (polite && posting_.load() > 0) {
    reading_.store(false);
    return -FI_EAGAIN;
  }
  const ssize_t n = InProvider(*h_, [&] { return fi_cq_read(h_->cq, entries, kCqBatch); });
  reading_.store(false);
  return n;
}

ssize_t RdmEndpoint::PostBetweenReads(const std::function<ssize_t()>& post) {
  posting_.fetch_add(1);
  // One fi_cq_read at most: readers let posters go first.
  for (SpinPause p; reading_.load();) p.Once();
  const ssize_t r = InProvider(*h_, post);
  posting_.fetch_sub(1);
  return r;
}

void RdmEndpoint::ProgressLoop() {
  fi_cq_data_entry entries[kCqBatch];
  auto last_activity = Clock::now();
  for (unsigned reads = 1; !stop_; ++reads) {
    if (cq_callers_.load() > 0) {
      // A caller in Next() reads the CQ and posts what was deferred. This thread naps: spinning
      // beside it, even politely, made the tcp round trip slower (H100, 2026-11-26-e), and it
      // spins again after the caller leaves, as after any activity.
      progress_hot_.store(true);
      std::this_thread::sleep_for(kCallerNap);
      last_activity = Clock::now();
      continue;
    }
    std::unique_lock<std::mutex> cq(cq_mu_);
    // Politely, but posters that keep coming do not keep the completions unread.
    ssize_t n = ReadCq(entries, /*polite=*/reads % 64 != 0);
    if (n == -FI_EAGAIN) {
      if (deferred_) RetryDeferred();
      const auto spin = std::chrono::microseconds(spin_us_.load(std::memory_order_relaxed));
      bool spinning = waiters_ > 0 || Clock::now() - last_activity < spin;
      progress_hot_.store(spinning);
      if (spinning) {
        // Spin politely: on a few cores the thread that will answer may need this one.
        cq.unlock();
        std::this_thread::yield();
        continue;
      }
      // A caller that started reading in Next() just now found this thread hot and did not
      // kick it: it must not find the CQ held through the wait below (seq_cst: the caller
      // counts itself, then looks at progress_hot_; this thread the reverse).
      if (cq_callers_.load() > 0) continue;
      // Not polling any more: a send handed over before the flag fell goes first (one handed
      // over after it comes with a Kick, which ends the wait below).
      if (deferred_) RetryDeferred();
      // Deferred work waits on the provider: retry soon, but never spin for it on a busy machine.
      int block_ms = deferred_ ? 1 : kBlockMs;
      if (h_->can_block) {
        // A caller that starts spinning in Next() meanwhile kicks this wait short.
        // A RegionChange meanwhile kicks it short too: it waits for this read to end.
        n = InProvider(*h_, [&] { return fi_cq_sread(h_->cq, entries, kCqBatch, nullptr, block_ms); });
      } else {
        cq.unlock();
        std::this_thread::sleep_for(kNap);
        continue;
      }
    }
    if (n > 0) {
      Dispatch(entries, n);
      last_activity = Clock::now();
    } else if (n == -FI_EAVAIL) {
      DispatchError();
      last_activity = Clock::now();
    } else if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT && n != -FI_EINTR) {
      log::Error("fabric: reading the completion queue: {}", fi_strerror(static_cast<int>(-n)));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

void RdmEndpoint::Dispatch(const fi_cq_data_entry* entries, ssize_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (ssize_t i = 0; i < n; ++i) {
    auto* ctx = static_cast<OpContext*>(entries[i].op_context);
    if (ctx == nullptr) {
      log::Debug("fabric: completion without context (flags {:#x})", entries[i].flags);
      continue;
    }
    switch (ctx->kind) {
      case OpContext::Kind::kRecv:
        OnReceive(static_cast<RecvSlot*>(ctx), entries[i].len);
        break;
      case OpContext::Kind::kSend: {
        auto* op = static_cast<SendOp*>(ctx);
        sends_in_flight_.erase(op);
        ReleaseBuffer(std::move(op->buf));
        delete op;
        break;
      }
      case OpContext::Kind::kRma:
        OnRmaDone(static_cast<RmaChunk*>(ctx), Status::Ok());
        break;
    }
  }
}

void RdmEndpoint::DispatchError() {
  fi_cq_err_entry err{};
  ssize_t r = InProvider(*h_, [&] { return fi_cq_readerr(h_->cq, &err, 0); });
  if (r == -FI_EAGAIN) return;
  if (r < 0) {
    log::Error("fabric: fi_cq_readerr: {}", fi_strerror(static_cast<int>(-r)));
    return;
  }
  char detail[256];
  const char* prov = fi_cq_strerror(h_->cq, err.prov_errno, err.err_data, detail, sizeof(detail));
  Status why(Code::kLinkLost, std::string(fi_strerror(err.err)) + " (" + (prov ? prov : "?") + ")");
  std::lock_guard<std::mutex> lock(mu_);
  auto* ctx = static_cast<OpContext*>(err.op_context);
  if (ctx == nullptr) {
    log::Warn("fabric: error completion without context: {}", why.message());
    return;
  }
  switch (ctx->kind) {
    case OpContext::Kind::kRecv:
      // A failed receive (e.g. truncated) loses that message only; the buffer goes back.
      log::Warn("fabric: receive failed: {}", why.message());
      Repost(static_cast<RecvSlot*>(ctx));
      break;
    case OpContext::Kind::kSend: {
      auto* op = static_cast<SendOp*>(ctx);
      log::Debug("fabric: send to peer {} failed: {}", op->peer, why.message());
      PeerFailed(op->peer, why);
      sends_in_flight_.erase(op);
      ReleaseBuffer(std::move(op->buf));
      delete op;
      break;
    }
    case OpContext::Kind::kRma: {
      auto* chunk = static_cast<RmaChunk*>(ctx);
      log::Debug("fabric: RMA to peer {} failed: {}", chunk->op->peer, why.message());
      PeerFailed(chunk->op->peer, why);
      OnRmaDone(chunk, why);
      break;
    }
  }
}

void RdmEndpoint::RetryDeferred() {
  std::lock_guard<std::mutex> lock(mu_);
  // Receive buffers first: without them nothing comes in.
  std::vector<RecvSlot*> slots;
  slots.swap(recv_deferred_);
  for (RecvSlot* s : slots) Repost(s);
  // In order per peer; a peer the provider cannot take more for now (a connection still being
  // made, a full queue) holds back only its own later sends, not other peers'.
  std::unordered_set<PeerId> held;
  bool left = false;  // a caller's frame left the queue: a sender held back by its peer's may go on
  const auto now = Clock::now();
  for (auto it = control_deferred_.begin(); it != control_deferred_.end();) {
    SendOp* op = it->get();
    if (held.contains(op->peer)) {
      ++it;
      continue;
    }
    // A caller's frame for a peer closed or lost meanwhile is dropped, as a Send then fails.
    Conn* c = op->handed_off ? FindConn(op->peer) : nullptr;
    ssize_t r = op->handed_off && (c == nullptr || c->state != Conn::State::kUp) ? -FI_ENOTCONN : PostSend(*op);
    if (r == -FI_EAGAIN && op->handed_off && now >= op->deadline) {
      // The peer took nothing for send_timeout (dead, or frozen): lost, with what waits for it.
      PeerFailed(op->peer, Status(Code::kTimeout, "fi_send: no progress (-FI_EAGAIN) before the deadline"));
      r = -FI_ENOTCONN;
    } else if (r == -FI_EAGAIN) {
      held.insert(op->peer);
      ++it;
      continue;
    }
    if (c != nullptr) {
      c->deferred -= op->len;
      left = true;
    }
    if (r == 0) {
      sends_in_flight_.insert(it->release());
    } else {
      if (!op->handed_off) log::Warn("fabric: control message to peer {}: {}", op->peer, fi_strerror(static_cast<int>(-r)));
      else if (c != nullptr) PeerFailed(op->peer, FiError(Code::kLinkLost, "fi_send", static_cast<int>(r)));
      ReleaseBuffer(std::move(op->buf));
    }
    it = control_deferred_.erase(it);
  }
  if (left) cv_.notify_all();
  std::vector<RmaOp*> stalled(rma_stalled_.begin(), rma_stalled_.end());
  for (RmaOp* op : stalled) Pump(*op);
  deferred_ = !recv_deferred_.empty() || !control_deferred_.empty() || !rma_stalled_.empty();
}

}  // namespace tandem::fabric
