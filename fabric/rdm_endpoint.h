// The libfabric RDM implementation of Endpoint. One endpoint, one CQ, one AV (FI_AV_TABLE),
// one progress thread. Callers post sends and RMA directly (the domain is FI_THREAD_SAFE).
// One thread reads the CQ at a time (cq_mu_): a caller spinning in Next() for its next message
// reads it itself while the progress thread stays off it, and the progress thread otherwise;
// everything read is dispatched under mu_.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "handles.h"
#include "tandem/fabric/fabric.h"
#include "reassembly.h"
#include "wire.h"

namespace tandem::fabric {

using Clock = std::chrono::steady_clock;

// Completions read at once.
constexpr int kCqBatch = 16;

// Every posted operation's context starts with fi_context2 (mode FI_CONTEXT | FI_CONTEXT2:
// the provider owns those bytes until the completion).
struct OpContext {
  enum class Kind { kRecv, kSend, kRma };
  fi_context2 fi{};
  Kind kind;
  explicit OpContext(Kind k) : kind(k) {}
};

// A fixed-size message buffer, registered when the provider wants FI_MR_LOCAL.
struct Buffer {
  std::unique_ptr<uint8_t[]> data;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  bool pooled = true;  // false: sized to one deferred frame, freed after use (not a send buffer)
};

struct RecvSlot : OpContext {
  Buffer buf;
  RecvSlot() : OpContext(Kind::kRecv) {}
};

struct SendOp : OpContext {
  PeerId peer = 0;
  Buffer buf;  // returned to the pool on completion
  size_t len = 0;                  // of the frame in buf, and where it goes:
  fi_addr_t addr = FI_ADDR_UNSPEC;  // used when the post is deferred
  bool handed_off = false;          // a caller's frame (handed off, or deferred on -FI_EAGAIN), not control
  Clock::time_point deadline = Clock::time_point::max();  // a caller's: its peer is lost when not posted by then
  SendOp() : OpContext(Kind::kSend) {}
};

struct RmaOp;
struct RmaChunk : OpContext {
  RmaOp* op = nullptr;
  size_t len = 0;
  RmaChunk() : OpContext(Kind::kRma) {}
};

// One PostRead/PostWrite: chunks posted with a window in flight; freed once it is both
// finished (every posted chunk completed) and released (Wait returned or will not be called).
struct RmaOp {
  OpId id = 0;
  PeerId peer = 0;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  bool write = false;
  uint8_t* local = nullptr;
  void* desc = nullptr;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
  size_t len = 0;
  size_t next = 0;  // first byte not yet posted
  int in_flight = 0;
  Status error;
  bool released = false;
  std::vector<std::unique_ptr<RmaChunk>> chunks;  // the window's contexts
  std::vector<RmaChunk*> idle;
  bool finished() const { return in_flight == 0 && (next == len || !error.ok()); }
};

struct Conn {
  enum class State { kConnecting, kUp, kFailed, kLost };  // kFailed: the connect did not succeed
  PeerId id = 0;
  uint64_t conn_id = 0;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  std::string name;  // host:port, or the peer's address for accepted connections
  State state = State::kConnecting;
  Status failure;
  uint64_t next_send_id = 0;
  size_t deferred = 0;  // bytes of this peer's caller frames waiting in control_deferred_
  Reassembly inbound;   // its messages, put back together and handed on in order
};

// fi_getinfo hints for an RDM endpoint of `provider` (freed by the caller with fi_freeinfo).
fi_info* MakeHints(const std::string& provider);

class RdmEndpoint final : public Endpoint {
 public:
  static Result<std::unique_ptr<Endpoint>> Open(const Options& options);
  ~RdmEndpoint() override;

  std::string provider() const override { return provider_; }
  std::string address() const override { return address_; }
  uint16_t port() const override { return port_; }

  Result<PeerId> Connect(const std::string& host_port, Millis timeout) override;
  void Close(PeerId peer) override;
  Status Send(PeerId peer, std::vector<uint8_t> data) override;
  Result<Event> Next(Micros timeout) override;
  void Interrupt() override;
  void SetSpin(int us) override { spin_us_.store(us < 0 ? 0 : us); }
  uint64_t sends_handed_off() const override { return sends_handed_off_.load(); }

  Result<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len, uint32_t access) override;
  Result<OpId> PostRead(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                        uint64_t remote_offset, size_t len) override;
  Result<OpId> PostWrite(PeerId peer, MemoryRegion& local, size_t local_offset, const RemoteRegion& remote,
                         uint64_t remote_offset, size_t len) override;
  Status Wait(OpId op, Millis timeout) override;
  bool InFlight(OpId op) override;

 private:
  RdmEndpoint() = default;

  // Setup (rdm_setup.cc).
  Status OpenAt(const Options& options, const std::string& host, const std::string& service);
  Status PostReceives(int count);
  Result<Buffer> NewBuffer(size_t bytes = 0);  // 0: a send/receive buffer (header + max_message)
  void FreeBuffer(Buffer& b);
  bool mr_local() const;
  Result<fid_mr*> RegisterRaw(void* addr, size_t len, uint64_t access);

  // Messages (rdm_messages.cc).
  // may_defer: a caller's data frame, which the progress thread posts when the provider does
  // not take it at once (Defer); otherwise the caller retries until the deadline.
  Status SendFrame(PeerId peer, fi_addr_t addr, const wire::Header& h, const uint8_t* payload, size_t len,
                   Clock::time_point deadline, bool may_inject, bool may_defer = false);
  // Queues a caller's frame for the progress thread: op (buf, len, addr and peer set), or a copy
  // of header and payload in a buffer of its own size.
  Status Defer(std::unique_ptr<SendOp> op, Clock::time_point deadline);
  Status Defer(PeerId peer, fi_addr_t addr, const wire::Header& h, const uint8_t* payload, size_t len,
               Clock::time_point deadline);
  bool Backlogged(PeerId peer);
  Status PostWithRetry(const char* what, Clock::time_point deadline, const std::function<ssize_t()>& post);
  // A pooled send buffer; when all are in flight, waits for one until the deadline, or with
  // !wait fails at once (kTimeout).
  Result<Buffer> TakeBuffer(Clock::time_point deadline, bool wait = true);
  void ReleaseBuffer(Buffer b);
  // A queued frame (op's buffer, length and address) or a receive buffer, to the provider.
  ssize_t PostSend(SendOp& op);
  ssize_t PostRecv(RecvSlot& slot);
  void Repost(RecvSlot* slot);
  void SendBye(fi_addr_t addr, uint64_t conn_id);
  void OnReceive(RecvSlot* slot, size_t len);
  void OnConnect(const wire::Header& h, const uint8_t* payload, size_t len);
  void OnData(Conn& c, const wire::Header& h, const uint8_t* payload, size_t len);
  void QueueControl(fi_addr_t addr, PeerId peer, const wire::Header& h, const std::vector<uint8_t>& payload);
  void RemoveConn(PeerId peer);
  void PeerFailed(PeerId peer, Status why);
  void Push(Event e);
  Conn* FindConn(PeerId peer);

  // RMA (rdm_rma.cc).
  Result<OpId> PostRma(bool write, PeerId peer, MemoryRegion& local, size_t local_offset,
                       const RemoteRegion& remote, uint64_t remote_offset, size_t len);
  void Pump(RmaOp& op);
  void OnRmaDone(RmaChunk* chunk, Status status);
  void FinishIfDone(RmaOp& op);

  // Progress (rdm_progress.cc).
  void ProgressLoop();
  // fi_cq_read into entries (kCqBatch of them); cq_mu_ held. With `polite`, a caller about to
  // post a message goes first (-FI_EAGAIN, nothing read): blocked on the provider's lock, that
  // caller would sleep in the kernel, and the reply to what it sends waits for its wake-up.
  ssize_t ReadCq(fi_cq_data_entry* entries, bool polite);
  // Posts a caller's message (fi_inject, fi_send) between two reads of the CQ, not during one.
  ssize_t PostBetweenReads(const std::function<ssize_t()>& post);
  void Dispatch(const fi_cq_data_entry* entries, ssize_t n);
  void DispatchError();
  void RetryDeferred();
  // Wakes the progress thread so that it spins (a caller is waiting for the provider).
  void Kick();

  std::shared_ptr<Handles> h_;
  std::string provider_;
  std::string address_;
  uint16_t port_ = 0;
  bool listening_ = false;
  size_t max_message_ = 0;  // payload bytes per fabric message
  Millis send_timeout_{10000};
  size_t inject_size_ = 0;
  size_t rma_chunk_ = 0;
  std::atomic<int> spin_us_{0};
  int hand_off_idle_us_ = 0;
  std::atomic<bool> progress_hot_{false};  // the progress thread is busy-polling
  std::atomic<uint64_t> sends_handed_off_{0};
  uint64_t mr_mode_ = 0;  // what the provider returned, honoured everywhere
  std::atomic<uint64_t> next_key_{1};  // requested keys when the provider does not choose them
  std::vector<uint8_t> my_address_;  // raw fi_getname()

  std::thread progress_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> deferred_{false};  // something in the *_deferred_ / rma_stalled_ lists
  std::atomic<int> waiters_{0};  // callers waiting on -FI_EAGAIN or a buffer: keep spinning
  std::mutex cq_mu_;                // held by whoever reads the CQ and dispatches what it read
  std::atomic<int> cq_callers_{0};  // callers spinning in Next() that read the CQ themselves
  std::atomic<int> posting_{0};     // callers in PostBetweenReads
  std::atomic<bool> reading_{false};  // a thread is inside fi_cq_read

  std::mutex mu_;
  std::condition_variable cv_;  // connections, RMA ops and send buffers change state
  std::unordered_map<PeerId, std::unique_ptr<Conn>> peers_;
  std::unordered_map<uint64_t, PeerId> by_conn_id_;
  PeerId next_peer_ = 1;
  std::vector<std::unique_ptr<RecvSlot>> recv_slots_;
  std::vector<RecvSlot*> recv_deferred_;  // repost failed with -FI_EAGAIN
  // Sends the progress thread posts: its own control messages, and callers' handed-off ones.
  std::deque<std::unique_ptr<SendOp>> control_deferred_;
  std::unordered_set<SendOp*> sends_in_flight_;  // owned; freed by their completion
  std::vector<Buffer> free_buffers_;
  size_t buffers_total_ = 0;
  std::unordered_map<OpId, std::unique_ptr<RmaOp>> rma_ops_;
  std::unordered_set<RmaOp*> rma_stalled_;  // posting hit -FI_EAGAIN
  OpId next_op_ = 1;
  std::mt19937_64 rng_{std::random_device{}()};  // connection ids

  std::mutex events_mu_;
  std::condition_variable events_cv_;
  std::deque<Event> events_;
  std::atomic<size_t> events_pending_{0};  // events_.size(), readable without the lock
  bool interrupted_ = false;
};

}  // namespace tandem::fabric
