// A session's command handling without any transport: the worker feeds it the client's
// request batches and sends back what it returns. Keeping it transport-free lets the
// in-process tests and the fuzzer drive exactly the code a worker runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <condition_variable>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tandem/ir/codec.h"
#include "tandem/server/backend.h"
#include "tandem/server/late_replies.h"
#include "tandem/status.h"

namespace tandem::server {

class Profile;  // tandem/server/profile.h


struct BatchOutcome {
  std::vector<uint8_t> reply;  // one reply batch to send; empty when no record needed a reply
  // Replies deferred by the backend (Backend::ReplyLater), in order: send `reply` first,
  // then run these off the executor (LateReplies). A wait the session ran in place (the
  // client's ir::kRecordCallerWaits, and Backend::WaitRunsInPlace) is in `reply` instead.
  std::vector<LateReply> late;
  bool refuse_peer = false;    // not authenticated: send `reply`, then close the peer
  bool goodbye = false;        // the client ended the session
};

// Server-to-server copies (ir PeerSend / PeerRecv). The worker implements it over its fabric
// endpoint; in-process tests and the fuzzer have none, and those commands then fail cleanly.
class PeerLink {
 public:
  virtual ~PeerLink() = default;
  // A bulk channel whose Push sends `size` bytes of `transfer` to the worker that pulls it;
  // waits (bounded) for that worker's PeerPull.
  virtual Result<std::unique_ptr<BulkIO>> Source(uint64_t transfer, uint64_t size) = 0;
  // A bulk channel whose Pull asks the worker at `peer` ("host:port") for `transfer` and
  // hands its bytes over as they arrive.
  virtual Result<std::unique_ptr<BulkIO>> Sink(const std::string& peer, uint64_t transfer, uint64_t size) = 0;
  // Cross-server event waits (ir EventExport / EventImport). The exporting side: the event
  // behind `token` finished with `status` (0 or negative); the worker that watches the
  // token is told now or as soon as it asks. Callable from any thread.
  virtual void ExportDone(uint64_t token, int32_t status) = 0;
  // The importing side: asks the worker at `peer` for `token`; `done` runs once with the
  // status it answers, or a negative one if that worker is lost. Runs on the worker's receive
  // thread (or at once on failure), so `done` must be safe beside the executor.
  virtual Status Import(const std::string& peer, uint64_t token, std::function<void(int32_t status)> done) = 0;
  // Asynchronous transfers (Backend::ReadToHost / WriteFromHost). Offer: the source's bytes of
  // `transfer` are ready, or could not be read; they go to the worker that pulls the
  // transfer whenever its pull comes. Callable from any thread.
  virtual void Offer(uint64_t transfer, uint64_t size, Result<std::shared_ptr<HostBuffer>> bytes) = 0;
  // Expect: asks the worker at `peer` for `transfer` into `into` (the transfer's size); `done`
  // runs once, on another thread, when every byte is there or the transfer failed.
  virtual Status Expect(const std::string& peer, uint64_t transfer, std::shared_ptr<HostBuffer> into,
                        std::function<void(const Status&)> done) = 0;
};

// Fault injection for tests and evaluation (tandemd --inject-*): flips one random bit of
// the data or digest of a read back with probability `bitflip_rate` per read back, or as a
// Poisson process of `bitflip_per_s` flips a second (the first read back once one is due).
struct FaultInjection {
  double bitflip_rate = 0;
  double bitflip_per_s = 0;
  uint64_t seed = 0;  // 0: from the clock
};

class Session {
 public:
  // Deferred asynchronous errors kept at most between two replies (the rest are counted).
  static constexpr size_t kMaxDeferred = 256;
  // Server-to-server copies up to this size go through host memory without holding the
  // executor (Backend::ReadToHost / WriteFromHost); larger ones stream in chunks through it.
  // tandemd's TANDEM_ASYNC_PEER_BYTES changes it (0: every copy holds the executor).
  static constexpr uint64_t kAsyncPeerBytes = 64u << 20;
  // Host bytes that asynchronous transfers may hold at once (async_bytes_).
  static constexpr uint64_t kAsyncPeerBudget = 1ull << 30;
  // Bytes that the inline read backs of one request message may ask for, all together.
  static constexpr uint64_t kMaxInlineReplyBytes = 1ull << 30;

  // With defer_replies, replies that wait on the device come back in BatchOutcome::late
  // instead of blocking HandleBatch.
  Session(Backend* backend, uint64_t session_key, bool defer_replies = false);

  // Runs one incoming message (a request batch) record by record, in order. Until the
  // session is attached, only an Attach with the right key as first record is accepted.
  BatchOutcome HandleBatch(std::span<const uint8_t> msg);

  // Runs `msg` at once when every record of it is an urgent command (ir::kUrgent: Ping,
  // UserEventSet) of an attached session, so the receive thread answers liveness checks and
  // sets user events while the executor is blocked (a read waiting on a user event the
  // client sets later). Returns the reply batch to send (empty if none is due), or nullopt
  // when the batch is for the executor. Thread-safe against HandleBatch. Its replies carry
  // no deferred errors: those go with the command stream's next reply.
  std::optional<std::vector<uint8_t>> RunUrgent(std::span<const uint8_t> msg);

  bool attached() const { return attached_.load(); }
  void set_peers(PeerLink* peers) { peers_ = peers; }
  void set_faults(const FaultInjection& faults);
  // Records run so far (for --inject-stall-after / --inject-exit-after) and flips injected.
  uint64_t commands_run() const { return commands_run_.load(); }
  uint64_t flips_injected() const { return flips_; }
  // Told how long the client wants the worker's threads to keep looking for messages before
  // they sleep (Warm's spin_us; capped).
  void set_spin_hook(std::function<void(uint32_t spin_us)> hook) { spin_hook_ = std::move(hook); }
  // Holding: with it, a command that waits on another server (an imported
  // event not answered yet, a server-to-server copy's bytes not here yet), and every command
  // after it on its stream or waiting on its signal, stays in the session until that server
  // has answered; then the session hands them to the backend in order. A command that wants a
  // reply waits for that on the executor. The backend decides (Backend::HoldsForPeers);
  // tandemd's TANDEM_SERVER_HOLD=0 turns it off.
  void set_hold(bool hold) { hold_ = hold; }
  bool hold() const { return hold_; }
  // Tells the executor's thread that RunReleased has work (any thread calls it).
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }
  // Runs what other threads released for held commands, then the held commands that can go
  // now; on the executor's thread (HandleBatch does it too, first).
  BatchOutcome RunReleased();
  // Commands held now (tests).
  size_t held() const { return held_.size(); }

  // Whether the thread that runs BatchOutcome::late has nothing left to run (any thread may
  // ask; only HandleBatch's caller gives it work). Unset: never idle.
  void set_waiter_idle(std::function<bool()> idle) { waiter_idle_ = std::move(idle); }

  // The dispatch table entry point for one command type (public so the table can name it).
  template <class Req>
  void Run(const ir::Record& rec, ir::BatchWriter& out);
  template <class Req>
  void RefuseBrokerCommand(const ir::Record& rec, ir::BatchWriter& out);

 private:
  // A command whose signal event failed: EventQuery/EventWait answer with `event_status`
  // and commands that wait on it fail with `status`.
  struct FailedEvent {
    Status status;
    int32_t event_status = -1;
  };

  // ---- holding ----
  // A PeerRecv's write, run once its bytes came (or failed) and nothing before it holds it.
  struct Arrival {
    ir::PeerRecvReq req;
    uint64_t seq = 0;
    std::shared_ptr<HostBuffer> bytes;
    bool came = false;  // set on the executor, from a release
    Status status;
  };
  // What holding looks at in a command (KeysOf): its stream, the events it waits on or
  // names, its signal, and whether it ends objects (or syncs a whole device).
  struct HoldKeys {
    uint64_t stream = 0;
    bool has_stream = false;
    uint64_t signal = 0;
    bool ends_objects = false;
    std::vector<uint64_t> events;
  };
  struct HeldCommand {
    ir::RecordHeader header;
    std::vector<uint8_t> payload;      // a record, run again through its handler
    std::shared_ptr<Arrival> arrival;  // or a PeerRecv's write
    HoldKeys keys;
  };
  bool Holding() const { return hold_ && (!held_.empty() || !unanswered_.empty()); }
  bool Pending(uint64_t event) const {
    return event != 0 && (held_signals_.contains(event) || unanswered_.contains(event));
  }
  template <class Req>
  static HoldKeys KeysOf(const Req& req);
  bool Blocked(const HoldKeys& keys) const;
  // The failure of the first event of `wait` whose command failed (Ok if none).
  Status FailedWait(const ir::u64s& wait) const;
  void Hold(HeldCommand command);
  Status HoldArrival(const ir::PeerRecvReq& req);
  Status HoldImport(const ir::EventImportReq& req);
  Status ImportFrom(const ir::EventImportReq& req, std::function<void(int32_t status)> answered);
  void RunArrival(Arrival& a);
  // Queues `fn` for the executor (any thread) and wakes it.
  void PostRelease(std::function<void()> fn);
  // Runs the posted releases, then Replay. Executor only.
  void TakeReleases();
  void Replay();
  // Blocks the executor, taking releases as they come, until `ready` holds.
  void WaitUntil(const std::function<bool()>& ready);

  template <class Req>
  Status Execute(const Req& req, typename Req::Reply* rep);
  // What Execute hands to the backend: the backend's own method, except for the commands the
  // session turns into backend transfers over another bulk channel.
  template <class Req>
  Status Call(const Req& req, typename Req::Reply* rep);
  Status Call(const ir::PeerSendReq& req, ir::PeerSendRep* rep);
  Status Call(const ir::PeerRecvReq& req, ir::PeerRecvRep* rep);
  Status Call(const ir::EventExportReq& req, ir::EventExportRep* rep);
  Status Call(const ir::EventImportReq& req, ir::EventImportRep* rep);
  Status Call(const ir::WarmReq& req, ir::WarmRep* rep);
  Status Call(const ir::BufferDigestReq& req, ir::BufferDigestRep* rep);
  // Maybe flips one bit of a read back (fault injection).
  void MaybeFlip(std::vector<uint8_t>& data);
  void MaybeFlip(std::vector<uint64_t>& digests);
  bool FlipDue();
  Status WithBulk(BulkIO* io, const std::function<Status()>& run);
  Status Execute(const ir::AttachReq& req, ir::AttachRep* rep);
  Status Execute(const ir::PingReq& req, ir::PingRep* rep);
  Status Execute(const ir::GoodbyeReq& req, ir::GoodbyeRep* rep);
  Status Execute(const ir::OutputReq& req, ir::OutputRep* rep);
  Status Execute(const ir::ResumeReq& req, ir::ResumeRep* rep);
  Status Execute(const ir::AckReq& req, ir::AckRep* rep);
  Status Execute(const ir::EventQueryReq& req, ir::EventQueryRep* rep);
  Status Execute(const ir::EventWaitReq& req, ir::EventWaitRep* rep);
  Status Execute(const ir::EventDestroyReq& req, ir::EventDestroyRep* rep);
  Status ExecuteUrgent(const ir::PingReq& req, ir::PingRep* rep);
  Status ExecuteUrgent(const ir::UserEventSetReq& req, ir::UserEventSetRep* rep);

  std::vector<uint8_t> WithOutput(ir::BatchWriter& replies);
  bool Authenticate(std::span<const uint8_t> msg, ir::BatchWriter& out);
  void ReplyError(const ir::Record& rec, const Status& st, ir::BatchWriter& out);
  template <class Rep>
  void Reply(const ir::Record& rec, const Status& st, const Rep* rep, ir::BatchWriter& out);
  // `waited`: the command failed because an event of its wait list had (FailedWait).
  void Defer(const ir::Record& rec, const Status& st, uint64_t signal, uint64_t stream, bool waited = false);
  std::vector<ir::AsyncError> TakeDeferred();
  void NoteSignal(uint64_t signal, const Status& st);
  // An imported event's answer came (any thread): completes its stand-in, and queues it for
  // destruction if the client already destroyed it (a command may still wait on it).
  void CompleteImport(uint64_t event, int32_t status);
  // Destroys the stand-ins CompleteImport queued (on the executor: backend tables are its own).
  void DestroyFinishedImports();
  // A command that finished off the executor failed (any thread): reported with the next
  // reply, and its signal fails, once the executor takes it (TakeAsyncFailures).
  void NoteAsyncFailure(ir::Opcode opcode, uint64_t signal, uint64_t stream, const Status& st);
  void TakeAsyncFailures();

  Backend* backend_;
  PeerLink* peers_ = nullptr;
  std::function<void(uint32_t)> spin_hook_;
  std::function<bool()> waiter_idle_;
  FaultInjection faults_;
  std::mutex flip_mu_;  // late replies flip on the waiter thread
  std::chrono::steady_clock::time_point next_flip_;  // with bitflip_per_s
  uint64_t rng_ = 0;
  uint64_t flips_ = 0;
  std::atomic<uint64_t> commands_run_{0};
  uint64_t session_key_;
  std::atomic<bool> attached_{false};
  bool goodbye_ = false;
  std::vector<ir::AsyncError> deferred_;
  uint64_t deferred_dropped_ = 0;
  std::unordered_map<uint64_t, FailedEvent> failed_events_;
  // Holding (see set_hold). Executor only, except the release queue.
  bool hold_ = false;
  std::deque<HeldCommand> held_;
  std::unordered_set<uint64_t> held_streams_;  // streams with a held command
  std::unordered_set<uint64_t> held_signals_;  // signals of held commands
  std::unordered_set<uint64_t> unanswered_;    // imported events whose server has not answered
  bool replaying_ = false;
  uint64_t current_seq_ = 0;  // the record being run
  // Bytes of inline read backs (replies that carry the data) taken on in the batch being run:
  // one request message must not make the worker hold, or one reply message carry, more than
  // kMaxInlineReplyBytes (a reply batch counts its bytes in 32 bits).
  uint64_t inline_reply_bytes_ = 0;
  ir::BatchWriter* out_ = nullptr;  // the replies of the batch being run (held commands' errors)
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  std::vector<std::function<void()>> releases_;
  std::atomic<bool> releases_due_{false};
  std::function<void()> wake_;
  std::vector<LateReply> late_;
  // Stand-ins of imported events not completed yet -> whether the client destroyed them.
  std::mutex imports_mu_;
  std::unordered_map<uint64_t, bool> imports_pending_;
  std::vector<uint64_t> imports_to_destroy_;
  struct AsyncFailure {
    ir::Opcode opcode;
    uint64_t signal;
    uint64_t stream;
    Status status;
  };
  std::mutex async_mu_;
  std::vector<AsyncFailure> async_failures_;
  // Host bytes of asynchronous copies between servers.
  std::shared_ptr<HostBytesBudget> async_bytes_ = std::make_shared<HostBytesBudget>(kAsyncPeerBudget);

  // TANDEM_SERVER_PROFILE=1: time spent on the executor per command, and the latencies of work
  // that finishes off it, logged when the session says goodbye.
  std::shared_ptr<Profile> profile_;
  uint64_t async_peer_bytes_ = kAsyncPeerBytes;
};

}  // namespace tandem::server
