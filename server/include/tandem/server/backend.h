// The interface between a session worker and the API that runs its commands.
// One virtual per IR command is generated from the table; a backend overrides what it
// supports and the rest answer kUnimplemented. Backends are registered explicitly
// (MakeOpenCLBackend, MakeCudaBackend), never by static initialisers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "tandem/ir/ir.h"
#include "tandem/status.h"

namespace tandem::server {

// Moves bulk data between the client's registered memory and the server, in chunks,
// so that a 256 MiB copy needs only a few staging chunks. Implemented by the worker over
// fabric RMA; the backend supplies the per-chunk device copy.
class BulkIO {
 public:
  virtual ~BulkIO() = default;
  // Reads `len` bytes of the client's region; calls sink(chunk, offset, n) in order.
  virtual Status Pull(const ir::Region& remote, size_t len,
                      const std::function<Status(const uint8_t* chunk, size_t offset, size_t n)>& sink) = 0;
  // Fills chunks with source(chunk, offset, n) and writes them to the client's region.
  virtual Status Push(const ir::Region& remote, size_t len,
                      const std::function<Status(uint8_t* chunk, size_t offset, size_t n)>& source) = 0;
};

// Host memory an asynchronous server-to-server transfer keeps its bytes in (pinned where the
// API needs that for copies that run later).
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
};

// `n` bytes of ordinary heap memory, not zeroed (what fills it writes every byte): the host
// copies of asynchronous transfers, in the session and the backends.
class HeapHostBuffer final : public HostBuffer {
 public:
  explicit HeapHostBuffer(size_t n) : bytes_(new uint8_t[n]), size_(n) {}
  // Null where the memory is not there (large transfers, which then take another path).
  static std::shared_ptr<HeapHostBuffer> TryMake(size_t n) {
    std::unique_ptr<uint8_t[]> bytes(new (std::nothrow) uint8_t[n]);
    return bytes ? std::shared_ptr<HeapHostBuffer>(new HeapHostBuffer(std::move(bytes), n)) : nullptr;
  }
  uint8_t* data() override { return bytes_.get(); }
  size_t size() const override { return size_; }

 private:
  HeapHostBuffer(std::unique_ptr<uint8_t[]> bytes, size_t n) : bytes_(std::move(bytes)), size_(n) {}
  std::unique_ptr<uint8_t[]> bytes_;
  size_t size_;
};

// Host memory that asynchronous transfers hold at once (a session's server-to-server copies;
// the OpenCL backend's bulk transfers through host memory, under a budget of their own): a
// transfer takes its size before it allocates, and gives it back when the last holder of its
// bytes lets them go (Counted) or when it never allocated (Give). Past the cap a transfer
// takes its blocking path instead. Thread-safe.
class HostBytesBudget {
 public:
  explicit HostBytesBudget(uint64_t cap) : cap_(cap) {}
  // Room for `n` more bytes: false, and nothing taken, past the cap.
  bool Take(uint64_t n) {
    uint64_t now = used_.load();
    do {
      if (n > cap_ || now > cap_ - n) return false;
    } while (!used_.compare_exchange_weak(now, now + n));
    return true;
  }
  void Give(uint64_t n) { used_.fetch_sub(n); }
  uint64_t used() const { return used_.load(); }
  // `buffer`, whose size was taken, given back when it goes.
  static std::shared_ptr<HostBuffer> Counted(std::shared_ptr<HostBytesBudget> budget,
                                             std::shared_ptr<HostBuffer> buffer);

 private:
  const uint64_t cap_;
  std::atomic<uint64_t> used_{0};
};

namespace detail {
class CountedHostBuffer final : public HostBuffer {
 public:
  CountedHostBuffer(std::shared_ptr<HostBytesBudget> budget, std::shared_ptr<HostBuffer> inner)
      : budget_(std::move(budget)), inner_(std::move(inner)) {}
  ~CountedHostBuffer() override { budget_->Give(inner_->size()); }
  uint8_t* data() override { return inner_->data(); }
  size_t size() const override { return inner_->size(); }

 private:
  std::shared_ptr<HostBytesBudget> budget_;
  std::shared_ptr<HostBuffer> inner_;
};
}  // namespace detail

inline std::shared_ptr<HostBuffer> HostBytesBudget::Counted(std::shared_ptr<HostBytesBudget> budget,
                                                            std::shared_ptr<HostBuffer> buffer) {
  return std::make_shared<detail::CountedHostBuffer>(std::move(budget), std::move(buffer));
}

// A reply's wait that a backend deferred (Backend::ReplyLater): `wait` blocks until the device
// work the reply waits for is done (or failed) and says how it went. `done`, which must not
// block, says whether that work has completed yet; the session's late replies use it to send a
// reply after the earlier ones its completion implies (a read's bytes before the answer of a
// later wait on its queue), without holding it behind earlier ones that still wait (on a user
// event that only a later command sets). Null: taken as done.
struct DeferredWait {
  std::function<Status()> wait;
  std::function<bool()> done;
  // The backend chose a wait that only runs right away, on the executor (WaitRunsInPlace was
  // true): it may wait for commands enqueued after it (OpenCL's clFinish). The session runs it
  // in place, never off the executor.
  bool in_place_only = false;
  explicit operator bool() const { return static_cast<bool>(wait); }
  Status operator()() const { return wait(); }
};

// The destination half of an asynchronous transfer (Backend::WriteFromHost): the write is
// enqueued, and held with everything after it on its stream, until `release` runs: with Ok
// once `staging` holds the bytes, or with a failure to fail the write instead. `release`
// runs once, on any thread.
struct PendingWrite {
  std::shared_ptr<HostBuffer> staging;
  std::function<void(const Status&)> release;
};

struct BackendOptions {
  std::string devices;  // optional filter: comma-separated device indices of this backend
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "opencl (Portable Computing Language)", "cuda"
  virtual uint32_t device_count() const = 0;
  // With TANDEM_SERVER_PROFILE=1, at the session's end: the backend's own "profile:" lines.
  virtual void LogProfile() {}
  // The bulk channel of the commands that follow. `client`: the client's own channel, which
  // outlives every reply of the session (the worker's), so a late reply may still use it; a
  // server-to-server transfer's (Session::WithBulk) lives only for its command.
  void set_bulk(BulkIO* bulk, bool client = false) {
    bulk_ = bulk;
    bulk_is_client_ = bulk && client;
  }
  BulkIO* bulk() const { return bulk_; }
  bool bulk_is_client() const { return bulk_is_client_; }
  // Host memory for the client bulk channel's staging chunks, where the backend's device
  // copies reach it directly (CUDA: pinned), so a chunk needs no copy of its own on the way
  // between the device and the network. kUnimplemented: the channel allocates its own.
  // Called inside a transfer, one at a time: on the executor, and for a backend whose bulk
  // reads may pass through host memory (OpenCL's) also on the session's waiter.
  virtual Result<std::shared_ptr<HostBuffer>> BulkStaging(size_t n) {
    (void)n;
    return Status(Code::kUnimplemented, "the " + name() + " backend has no staging memory of its own");
  }
  // Output the session's device code printed (CUDA printf) since the last call, by fd
  // (1 stdout, 2 stderr). The worker sends it to the client as Output notifications ahead
  // of the replies of the batch, so it reaches the program before the sync that made it.
  virtual std::vector<std::pair<uint32_t, std::string>> TakeOutput() { return {}; }

  // Replies that wait on the device (a read back, a synchronize) need not block the
  // session's queue: a backend enqueues the work in order, then returns ReplyLater(wait).
  // When the session allows it, `wait` runs on the session's waiter thread and the reply
  // leaves when it returns, while later commands (an event query, another enqueue) go on,
  // unless the session runs it in place (EnqueuedCompleteAlone, ir::kRecordCallerWaits);
  // otherwise (direct calls, tests) it runs at once. `wait` must not touch the backend's
  // handle tables: it captures what it needs.
  void AllowDeferredReplies(bool allow) { defer_allowed_ = allow; }
  DeferredWait TakeDeferredReply() { return std::exchange(deferred_reply_, {}); }
  // Puts back a deferred wait the session took and wrapped (its own work after the backend's).
  void DeferReply(DeferredWait wait) { deferred_reply_ = std::move(wait); }
  // Set by the session before each command: true when a reply the command defers is the next
  // thing that runs after it, with nothing run on the executor in between: the last command of
  // its batch, no reply deferred before it in the batch, and the session's waiter idle (or the
  // wait run in place). A backend whose wait flushes its queue itself (OpenCL's clFinish and
  // clWaitForEvents) may then leave the flush to it. Otherwise it must flush first: a queue
  // left unflushed while the waiter blocks in an earlier wait, on a command that waits for
  // this queue's, might never start. The flag holds for all of the command's backend calls,
  // so a backend that leaves a flush to its wait must defer that wait as the command's last
  // act and block on nothing after it (OpenCL's FinishLater does).
  void set_wait_runs_next(bool next) { wait_runs_next_ = next; }
  bool wait_runs_next() const { return wait_runs_next_; }
  // Set by the session before each command: the client waits for its reply alone and posts
  // nothing meanwhile (ir::kRecordCallerWaits), the wait would run next, and nothing is held.
  // A wait the command defers then runs in place, on the executor, when EnqueuedCompleteAlone
  // (WaitRunsInPlace): nothing else is enqueued before it starts. Otherwise it may start after
  // later commands have been enqueued, so it must wait for what came before it only (OpenCL:
  // a marker's event, not clFinish, which would wait for a later command held by a user event
  // that the program sets only once this wait has returned).
  void set_caller_waits_alone(bool alone) { caller_waits_alone_ = alone; }
  bool WaitRunsInPlace() const { return caller_waits_alone_ && EnqueuedCompleteAlone(); }

  // Whether every command this backend has enqueued can complete without anything the
  // session runs later: no user event that the program or another server must still set, no
  // server-to-server gate. The session then runs a deferred wait (ReplyLater) that would run
  // next anyway, and that the client waits for alone (ir::kRecordCallerWaits), on the
  // executor itself, as a backend whose waits are synchronous does, and its reply leaves with
  // the batch's instead of through the waiter thread. Asked by the
  // session right after the command deferred, with nothing held. False (the default) keeps
  // every deferred wait off the executor, and marks it as one that may block
  // (LateReply::may_block): it runs on a side thread of LateReplies, not holding later replies.
  virtual bool EnqueuedCompleteAlone() const { return false; }

  // Whether the session should keep commands that wait on another server out of the backend
  // until that server has answered (Session's holding), instead of enqueueing them behind a
  // stand-in the backend completes later (WriteFromHost's gate, an imported user event). For
  // an implementation that submits what waits on such a stand-in late: NVIDIA's OpenCL.
  virtual bool HoldsForPeers() const { return false; }

  // The source end of a cross-server event wait (ir EventExport): arranges for done(status)
  // to run exactly once, on any thread, when `event` completes (0) or fails (negative),
  // without blocking the caller. An event that was never signalled is complete.
  virtual Status NotifyWhenDone(uint64_t event, std::function<void(int32_t status)> done) {
    (void)event;
    (void)done;
    return Status(Code::kUnimplemented, "cross-server event waits are not supported by the " + name() + " backend");
  }

  // Asynchronous halves of a server-to-server copy (ir PeerSend / PeerRecv), so a session's
  // executor never waits on another server: both enqueue in stream order, after `wait`, and
  // return at once; `signal` completes with the command. ReadToHost copies the range into a
  // host buffer and runs done(buffer) once, on any thread, when the bytes are there (or
  // done(why not)). WriteFromHost: see PendingWrite. kUnimplemented: the session then moves
  // the bytes through the blocking BulkIO path instead.
  virtual Status ReadToHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size, const ir::u64s& wait,
                            uint64_t signal, std::function<void(Result<std::shared_ptr<HostBuffer>>)> done) {
    return Status(Code::kUnimplemented, "asynchronous transfers are not supported by the " + name() + " backend");
  }
  virtual Result<PendingWrite> WriteFromHost(uint64_t stream, uint64_t buffer, uint64_t offset, uint64_t size,
                                             const ir::u64s& wait, uint64_t signal) {
    return Status(Code::kUnimplemented, "asynchronous transfers are not supported by the " + name() + " backend");
  }

  // Holding's write of a server-to-server copy whose bytes came (Session's PeerRecv when it
  // holds): in stream order after `wait`, signalling `signal`, from `bytes`, which the backend
  // keeps until it has read them. The default copies them into an ordinary BufferWrite.
  virtual Status WriteHostBytes(uint64_t stream, uint64_t buffer, uint64_t offset, const ir::u64s& wait,
                                uint64_t signal, std::shared_ptr<HostBuffer> bytes) {
    const uint8_t* p = bytes->data();
    ir::BufferWriteRep unused;
    return OnBufferWrite(ir::BufferWriteReq{.stream = stream, .buffer = buffer, .offset = offset,
                                            .size = bytes->size(), .data = ir::bytes(p, p + bytes->size()),
                                            .remote = {}, .wait = wait, .signal = signal},
                         &unused);
  }

  // Urgent commands (ir::kUrgent; today OnUserEventSet) are called from the worker's receive
  // thread while the executor may be inside any other method: they must be thread-safe.
#define X(op, Name, flags, req, rep)                                   \
  virtual Status On##Name(const ir::Name##Req&, ir::Name##Rep*) {      \
    return Status(Code::kUnimplemented, #Name " is not supported by the " + name() + " backend"); \
  }
  TANDEM_IR_COMMANDS(X)
#undef X

 protected:
  // A wait that may block on anything but device work (a user event, another server) must
  // give `done` (DeferredWait), or it holds every later reply while it waits.
  Status ReplyLater(DeferredWait wait) {
    if (!defer_allowed_) return wait();
    deferred_reply_ = std::move(wait);
    return Status::Ok();
  }
  Status ReplyLater(std::function<Status()> wait, std::function<bool()> done) {
    return ReplyLater(DeferredWait{std::move(wait), std::move(done)});
  }
  // Whether a wait given to ReplyLater runs later, off the executor (else right away).
  bool deferred_replies_allowed() const { return defer_allowed_; }
  BulkIO* bulk_ = nullptr;
  bool bulk_is_client_ = false;

 private:
  bool defer_allowed_ = false;
  bool wait_runs_next_ = false;
  bool caller_waits_alone_ = false;
  DeferredWait deferred_reply_;
};

// nullptr + status when the API or its devices are missing.
Result<std::unique_ptr<Backend>> MakeOpenCLBackend(const BackendOptions& options);
Result<std::unique_ptr<Backend>> MakeCudaBackend(const BackendOptions& options);

}  // namespace tandem::server
