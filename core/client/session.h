// Internal: one connection to a tandemd session worker, with batching and reply matching.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <span>
#include <vector>
#include <mutex>

#include "tandem/client/runtime.h"

namespace tandem::client {

using Clock = std::chrono::steady_clock;

// A fresh random transfer id for a server-to-server copy (a capability: whoever knows it
// may pull the bytes from the source worker).
uint64_t NewTransferId();
// Fault tolerance relays copies between virtual devices through the client (the relayed
// write is logged with its bytes, so a replay reproduces it).
void DisableDirectCopies();

// TANDEM_KEEPALIVE_MS (default 2 ms; 0: off): how long a used link may stay silent before
// the client warms it.
Clock::duration KeepaliveInterval();
// TANDEM_FAILOVER_TIMEOUT_MS (default 10 s): how long a server may stay silent while it is
// asked something before it counts as lost.
Clock::duration FailoverTimeout();

class SessionImpl final : public Session {
 public:
  SessionImpl(fabric::Endpoint* ep, fabric::PeerId peer, std::string server, std::string worker_address,
              std::string backend, std::function<void()> wake_flusher);

  const std::string& server() const override { return server_; }
  const std::string& backend() const override { return backend_; }
  const std::string& worker_address() const override { return worker_address_; }
  uint64_t PostRaw(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn) override;
  Status Flush() override;
  Status CallRaw(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields) override;
  Result<std::unique_ptr<fabric::MemoryRegion>> Register(const void* addr, size_t len, uint32_t access) override;
  bool rma() const override { return true; }
  std::vector<ir::AsyncError> TakeAsyncErrors() override;
  Status health() const override;

  // ---- used by the runtime's receiver and flusher threads ----
  fabric::PeerId peer() const { return peer_; }
  void OnMessage(std::span<const uint8_t> msg);
  // Fails every outstanding reply and refuses new work.
  void OnLost(const Status& why);
  // The same, on purpose (a session fault tolerance retired): no lost hook, no error log.
  void Close(const Status& why);
  // Periodic duties: flush a batch that waited long enough, ping an idle link, declare
  // the server lost when it stopped answering. Returns how soon it wants to run again.
  Clock::duration Tick(Clock::time_point now);
  bool has_queued() const;

  uint32_t device_count_hint = 0;  // from Attach
  // Whether device output (CUDA printf) reaches the program (off for voting replicas and
  // while a restore replays kernels).
  void set_forward_output(bool on) { forward_output_.store(on); }
  // Called once when the session is lost (fault tolerance migrates it).
  void set_lost_hook(std::function<void(SessionImpl*)> hook) { lost_hook_ = std::move(hook); }

 private:
  void ForwardOutput(std::span<const uint8_t> payload);
  Status FlushLocked(std::unique_lock<std::mutex>& lock);

  fabric::Endpoint* ep_;
  const fabric::PeerId peer_;
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
  // Keepalive: which paths the program has used (ir::kWarm*), on which devices, and when it
  // last posted anything itself.
  uint32_t warm_paths_ = 0;
  std::vector<uint64_t> warm_devices_;
  Clock::time_point last_program_{};
  int warm_left_ = 0;  // replies of the current keepalive round still to come

  // Called with mu_ held: what a program command says about the paths to keep warm.
  void NoteUse(uint16_t opcode, std::span<const uint8_t> payload);
  // Starts a keepalive round if one is due; returns how soon to look again. Releases `lock`
  // when it sends.
  Clock::duration Keepalive(std::unique_lock<std::mutex>& lock, Clock::time_point now);
};

}  // namespace tandem::client
