// Internal: one connection to a tandemd session worker, with batching and reply matching.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <span>
#include <vector>
#include <mutex>
#include <thread>

#include "tandem/client/runtime.h"

namespace tandem::client {

using Clock = std::chrono::steady_clock;

// Posts a command with a reply function, flushes, and waits for the reply (every
// Session's CallRaw, and Session::CallRawReleasing, which passes `held`: unlocked once the
// command is flushed, before the wait).
Status PostAndWait(Session& s, uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields,
                   std::unique_lock<std::mutex>* held = nullptr);

// A fresh random transfer id for a server-to-server copy (a capability: whoever knows it
// may pull the bytes from the source worker).
uint64_t NewTransferId();
// Fault tolerance relays copies between virtual devices through the client (the relayed
// write is logged with its bytes, so a replay reproduces it).
void DisableDirectCopies();

// How long an asynchronous command waits for companions before its batch is sent.
Clock::duration FlushDelay();
// TANDEM_KEEPALIVE_MS (default 2 ms; 0: off): how long a used link may stay silent before
// the client warms it.
Clock::duration KeepaliveInterval();
// A thread waiting for a reply reads the endpoint itself, when no other thread does, until
// `done` or `until` (RuntimeImpl::HelpReceive; reply callbacks may then run on it). Returns
// at once where no runtime runs (tests of a session alone).
void HelpReceive(const std::atomic<bool>& done, Clock::time_point until);
// How long, with keepalive on, fabric and worker threads look for the next message before
// they sleep: across the whole gap between two warm-ups (microseconds).
uint32_t KeepaliveSpinUs();
// TANDEM_FAILOVER_TIMEOUT_MS (default 10 s): how long a server may stay silent while it is
// asked something before it counts as lost.
Clock::duration FailoverTimeout();

class SessionImpl final : public Session {
 public:
  // With a `session_key`, the session is resumable: a link that breaks while the worker
  // lives is re-established to `worker_address` within FailoverTimeout() (Resume), and the
  // request batches the worker had not acknowledged are sent again, once.
  SessionImpl(fabric::Endpoint* ep, fabric::PeerId peer, std::string server, std::string worker_address,
              std::string backend, std::function<void()> wake_flusher, uint64_t session_key = 0);

  const std::string& server() const override { return server_; }
  const std::string& backend() const override { return backend_; }
  const std::string& worker_address() const override { return worker_address_; }
  uint64_t PostRaw(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) override {
    return Queue(opcode, std::move(payload), std::move(fn), false);
  }
  uint64_t PostRawAwaited(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) override {
    return Queue(opcode, std::move(payload), std::move(fn), true);
  }
  Status Flush() override;
  Status CallRaw(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields) override;
  Result<std::unique_ptr<fabric::MemoryRegion>> Register(const void* addr, size_t len, uint32_t access) override;
  bool rma() const override { return true; }
  std::vector<ir::AsyncError> TakeAsyncErrors() override;
  Status health() const override;

  // ---- used by the runtime's receiver and flusher threads ----
  fabric::PeerId peer() const { return peer_.load(); }
  void OnMessage(std::span<const uint8_t> msg);
  // The connection `peer` broke (a fabric peer loss or a failed send): a resumable session
  // reconnects (on a thread of its own) and only calls OnLost when that fails.
  void OnLinkLost(fabric::PeerId peer, const Status& why);
  // Fails every outstanding reply and refuses new work.
  void OnLost(const Status& why);
  // The same, on purpose (a session fault tolerance retired): no lost hook, no error log.
  // False when the session was already closed or lost.
  bool Close(const Status& why);
  // Periodic duties: flush a batch that waited long enough, ping an idle link, declare
  // the server lost when it stopped answering. Returns how soon it wants to run again.
  Clock::duration Tick(Clock::time_point now);
  bool has_queued() const;

  uint32_t device_count_hint = 0;  // from Attach
  // Fault tolerance (under its lock): this replica's deferred errors since the checkpoint, as
  // gathered (FaultTolerance::GatherErrors).
  std::vector<ir::AsyncError> ft_errors;
  // Whether device output (CUDA printf) reaches the program (off for voting replicas and
  // while a restore replays kernels).
  void set_forward_output(bool on) { forward_output_.store(on); }
  // Called once when the session is lost (fault tolerance migrates it).
  void set_lost_hook(std::function<void(SessionImpl*)> hook) { lost_hook_ = std::move(hook); }

 private:
  // PostRaw; `awaited`: PostRawAwaited.
  uint64_t Queue(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn, bool awaited);
  void ForwardOutput(std::span<const uint8_t> payload);
  Status FlushLocked(std::unique_lock<std::mutex>& lock);

  // Reconnects and resumes after a link loss; OnLost when it cannot within FailoverTimeout().
  void Reconnect(Status why);
  // Sends the unacknowledged batches again to `peer` (send_mu_ held); false when a send failed.
  bool Resend(fabric::PeerId peer, uint64_t executed, size_t* resent);
  // Drops the copies of request batches the worker acknowledged (seq <= executed).
  void Trim(uint64_t executed);

  fabric::Endpoint* ep_;
  std::atomic<fabric::PeerId> peer_;
  const std::string server_;
  const std::string worker_address_;
  const std::string backend_;
  const std::function<void()> wake_flusher_;

  mutable std::mutex mu_;
  std::mutex send_mu_;  // keeps batches in sequence order on the wire
  ir::BatchWriter batch_{ir::BatchKind::kRequests};
  Clock::time_point batch_started_{};
  uint64_t next_seq_ = 1;
  std::map<uint64_t, RawReplyFn> pending_;
  std::vector<ir::AsyncError> async_errors_;
  Status health_;
  Clock::time_point last_recv_ = Clock::now();
  Clock::time_point last_send_ = Clock::now();
  std::atomic<bool> forward_output_{true};
  std::function<void(SessionImpl*)> lost_hook_;
  bool ping_outstanding_ = false;  // a Ping or the Warm of a keepalive round is out
  Clock::time_point probe_sent_{};  // when that one was sent
  // Keepalive: which paths the program has used (ir::kWarm*), on which devices, and when it
  // last posted anything itself.
  uint32_t warm_paths_ = 0;
  std::vector<uint64_t> warm_devices_;
  Clock::time_point last_program_{};
  // The thread that posted the program's commands (all but Ping and Warm), while only one
  // has; many_posters_ is set for good once a second one posts. Only PostRawAwaited reads it.
  std::thread::id poster_{};
  bool many_posters_ = false;
  int warm_left_ = 0;  // replies of the current keepalive round still to come

  // ---- transient link loss (resumable sessions) ----
  const uint64_t session_key_;
  // Request batches sent (or due) but not yet acknowledged, in seq order, each with its
  // highest seq; guarded by unacked_mu_ (taken after send_mu_).
  struct Unacked {
    uint64_t top;
    std::vector<uint8_t> msg;
  };
  std::mutex unacked_mu_;
  std::deque<Unacked> unacked_;
  size_t unacked_bytes_ = 0;
  std::atomic<size_t> unacked_size_{0};  // unacked_bytes_ for Tick, without the lock
  // While set (a reconnect is under way) batches are only kept, not sent (read under send_mu_).
  std::atomic<bool> link_down_{false};
  bool reconnecting_ = false;  // mu_
  // The Resume exchange of the current reconnect attempt (mu_; resume_cv_).
  enum class ResumeState { kIdle, kWaiting, kOk, kFailed, kRefused };
  ResumeState resume_state_ = ResumeState::kIdle;
  Status resume_error_;
  uint64_t resume_executed_ = 0;
  std::condition_variable resume_cv_;
  // Reply batches received (the Ack reply_no of the last one); written by the receiver.
  std::atomic<uint64_t> replies_received_{0};
  uint64_t sends_ = 0;  // batches sent (send_mu_), for the test-only link cut
  int cuts_ = 0;

  // Called with mu_ held: what a program command says about the paths to keep warm.
  void NoteUse(uint16_t opcode, std::span<const uint8_t> payload);
  // Starts a keepalive round if one is due; returns how soon to look again. Releases `lock`
  // when it sends.
  Clock::duration Keepalive(std::unique_lock<std::mutex>& lock, Clock::time_point now);
};

}  // namespace tandem::client
