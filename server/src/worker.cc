// A session worker: one process per client session, so one client's crash, bad kernel or
// leak cannot touch another's. Its exit frees every resource of the session.
//
// Threads: the receiving thread reads the endpoint and runs urgent batches at once (Ping, so
// liveness keeps working while a batch is blocked in a long finish, and UserEventSet, so a
// command blocked on a user event can be released). Every other batch runs in order, one
// reply batch per batch, on one of two threads that take turns at receiving and running
// (Executor): a batch runs on the thread that received it when nothing else runs, and the
// other thread takes over receiving if it runs long. The waiter thread finishes replies that
// wait on the device (Backend::ReplyLater), and a reply that may wait for a user event gets a
// thread of its own (LateReplies).
#include <sys/personality.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "fabric_bulk.h"
#include "peer_link.h"
#include "tandem/fabric/fabric.h"
#include "tandem/log.h"
#include "tandem/server/session.h"
#include "tandem/spin.h"
#include "tandem/thread_name.h"
#include "tandemd.h"

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;

void Report(int fd, const std::string& line) {
  std::string msg = line + "\n";
  for (size_t done = 0; done < msg.size();) {
    ssize_t n = ::write(fd, msg.data() + done, msg.size() - done);
    if (n <= 0) return;  // the broker is gone; the session will time out unattached
    done += static_cast<size_t>(n);
  }
}

// Ends the process without running destructors: the executor may be blocked inside the
// backend (a kernel that never finishes), and the kernel frees everything anyway.
[[noreturn]] void EndNow(const std::string& why) {
  log::Info("session ends: {}", why);
  ::_exit(0);
}

std::string WithPort(const std::string& host, const char* port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// Appends the Ack notification (seq 0) as the last record of a finished reply batch.
void AppendAck(std::vector<uint8_t>& batch, uint64_t taken, uint64_t reply_no) {
  ir::BatchWriter w(ir::BatchKind::kReplies);
  w.AddRequest(ir::AckReq{.executed = taken, .reply_no = reply_no}, 0);
  const std::vector<uint8_t> one = w.Finish();
  // BatchHeader: magic u32, version u16, kind u16, count u32 (at 8), bytes u32 (at 12).
  auto patch = [&](size_t at, uint32_t add) {
    ir::StoreLE(batch.data() + at, ir::LoadLE<uint32_t>(batch.data() + at) + add);
  };
  patch(8, 1);
  patch(12, static_cast<uint32_t>(one.size() - ir::kBatchHeaderSize));
  batch.insert(batch.end(), one.begin() + ir::kBatchHeaderSize, one.end());
}

// The way to the client, shared by the receive thread, the executor and the waiter. For a
// resumable session it numbers reply batches, appends their Ack and keeps the newest ones
// (kCacheBytes) so they can be sent again to a client that reconnects.
class ClientLink {
 public:
  static constexpr size_t kCacheBytes = 64u << 20;

  explicit ClientLink(fabric::Endpoint* endpoint) : endpoint_(endpoint) {}
  void Start(fabric::PeerId client, bool resumable) {
    std::lock_guard<std::mutex> lock(mu_);
    client_ = client;
    resumable_ = resumable;
  }
  bool resumable() const {
    std::lock_guard<std::mutex> lock(mu_);
    return resumable_;
  }
  // The highest request seq the receive thread has taken (queued or run): only it writes.
  std::atomic<uint64_t> taken{0};

  // Sends one reply batch. Kept in order: numbers and wire order agree.
  void Send(std::vector<uint8_t> batch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!resumable_) {
      if (!client_) return;
      Status st = endpoint_->Send(*client_, std::move(batch));
      if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
      return;
    }
    const uint64_t no = ++sent_;
    AppendAck(batch, taken.load(), no);
    cache_bytes_ += batch.size();
    cache_.push_back({no, batch});
    while (cache_bytes_ > kCacheBytes && cache_.size() > 1) {
      cache_bytes_ -= cache_.front().batch.size();
      cache_.pop_front();
    }
    if (!client_) return;  // the link is down: sent again when the client resumes
    Status st = endpoint_->Send(*client_, std::move(batch));
    if (!st.ok()) log::Debug("reply batch {} not sent ({}): kept for a resume", no, st.ToString());
  }
  // The client's connection broke: replies are only kept until it resumes.
  void Lost() {
    std::lock_guard<std::mutex> lock(mu_);
    client_.reset();
  }
  // `peer` resumes the session having received `received` reply batches: answers its Resume
  // (seq `seq`), resends the batches it missed and makes it the client. Fails, answering
  // the peer with the error, when those batches are no longer all kept.
  Status Resume(fabric::PeerId peer, uint64_t seq, uint64_t received, size_t* resent) {
    std::lock_guard<std::mutex> lock(mu_);
    while (!cache_.empty() && cache_.front().no <= received) {
      cache_bytes_ -= cache_.front().batch.size();
      cache_.pop_front();
    }
    Status st;
    if (received > sent_)
      st = Status::Protocol(fmt::format("Resume: the client claims {} reply batches, only {} were sent", received, sent_));
    else if (received < sent_ && (cache_.empty() || cache_.front().no != received + 1))
      st = Status(Code::kServerLost, fmt::format("Resume: reply batches after {} are no longer kept (cache of {} MiB)",
                                                 received, kCacheBytes >> 20));
    ir::BatchWriter w(ir::BatchKind::kReplies);
    ir::ResumeRep rep{.executed = taken.load(), .sent = sent_};
    w.AddReply(static_cast<uint16_t>(ir::Opcode::kResume), seq, st, {}, st.ok() ? &rep : nullptr);
    Status sent = endpoint_->Send(peer, w.Finish());
    if (!st.ok()) return st;
    if (!sent.ok()) return sent;
    *resent = 0;
    for (const auto& c : cache_) {
      Status r = endpoint_->Send(peer, c.batch);
      if (!r.ok()) {
        log::Debug("resending reply batch {}: {}", c.no, r.ToString());
        break;
      }
      ++*resent;
    }
    client_ = peer;
    return Status::Ok();
  }

 private:
  struct Kept {
    uint64_t no;
    std::vector<uint8_t> batch;
  };
  fabric::Endpoint* endpoint_;
  mutable std::mutex mu_;
  std::optional<fabric::PeerId> client_;
  bool resumable_ = false;
  uint64_t sent_ = 0;  // reply batches numbered so far
  std::deque<Kept> cache_;
  size_t cache_bytes_ = 0;
};

// The bulk channel to the client (RMA on the client's registered memory) across reconnects:
// a transfer cut by a link loss is done again, whole, once the client has resumed (its
// chunks land at the same offsets, so doing it again is harmless).
class ClientBulk : public BulkIO {
 public:
  // cut_every (--inject-cut-bulk-every, tests only): the client's connection is dropped while
  // every N-th transfer is under way, before the network moved all of it.
  ClientBulk(fabric::Endpoint* endpoint, fabric::Millis op_timeout, fabric::Millis grace, uint64_t cut_every,
             FabricBulk::StagingAlloc alloc)
      : endpoint_(endpoint), op_timeout_(op_timeout), grace_(grace), cut_every_(cut_every), alloc_(std::move(alloc)) {}
  void Connect(fabric::PeerId peer) {
    auto bulk = std::make_shared<FabricBulk>(endpoint_, peer, op_timeout_, alloc_);
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(bulk);
    peer_ = peer;
    cv_.notify_all();
  }
  void Lost() {
    std::lock_guard<std::mutex> lock(mu_);
    current_.reset();
    cv_.notify_all();
  }
  // One transfer at a time: the executor's, and a late reply's (a bulk read that passed
  // through host memory writes its bytes from the session's waiter), share the staging; the
  // fault injection's count and cut belong to the transfer that runs.
  Status Pull(const ir::Region& remote, size_t len,
              const std::function<Status(const uint8_t* chunk, size_t offset, size_t n)>& sink) override {
    std::lock_guard<std::mutex> one_at_a_time(transfer_mu_);
    bool cut = CutThisOne();
    // A transfer of one chunk is cut before its read is posted (at its sink, the read would
    // already be done); a longer one at its first chunk, the next ones already being read.
    if (len <= FabricBulk::kChunk && std::exchange(cut, false)) CutNow();
    return Run([&](FabricBulk& b) {
      return b.Pull(remote, len, [&](const uint8_t* chunk, size_t offset, size_t n) {
        if (std::exchange(cut, false)) CutNow();
        return sink(chunk, offset, n);
      });
    });
  }
  Status Push(const ir::Region& remote, size_t len,
              const std::function<Status(uint8_t* chunk, size_t offset, size_t n)>& source) override {
    std::lock_guard<std::mutex> one_at_a_time(transfer_mu_);
    bool cut = CutThisOne();
    return Run([&](FabricBulk& b) {
      return b.Push(remote, len, [&](uint8_t* chunk, size_t offset, size_t n) {
        if (std::exchange(cut, false)) CutNow();  // before this chunk's RMA write is posted
        return source(chunk, offset, n);
      });
    });
  }

 private:
  bool CutThisOne() { return cut_every_ && ++transfers_ % cut_every_ == 0; }
  // Fault injection: drops the client's connection as a link loss would (the client sees it
  // closed, reconnects and resumes; the transfer under way fails and is done again).
  void CutNow() {
    fabric::PeerId peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!current_) return;
      peer = peer_;
    }
    log::Warn("fault injection: dropping the client's connection during bulk transfer {} (--inject-cut-bulk-every)",
              transfers_.load());
    endpoint_->Close(peer);
  }
  Status Run(const std::function<Status(FabricBulk&)>& transfer) {
    std::shared_ptr<FabricBulk> bulk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, grace_, [&] { return current_ != nullptr; });
      bulk = current_;
    }
    if (!bulk) return Status(Code::kLinkLost, "the client's connection is down");
    Status st = transfer(*bulk);
    for (int again = 0; !st.ok() && again < 3; ++again) {
      // A failure that a link loss caused: the receive thread sees the loss soon after.
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return current_ != bulk; })) return st;
      cv_.wait_for(lock, grace_, [&] { return current_ != nullptr; });
      if (!current_) return st;
      bulk = current_;
      lock.unlock();
      log::Info("a bulk transfer cut by a link loss is done again on the resumed connection");
      st = transfer(*bulk);
    }
    return st;
  }

  fabric::Endpoint* endpoint_;
  fabric::Millis op_timeout_;
  fabric::Millis grace_;
  const uint64_t cut_every_;
  const FabricBulk::StagingAlloc alloc_;
  std::atomic<uint64_t> transfers_{0};
  std::mutex transfer_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<FabricBulk> current_;
  fabric::PeerId peer_ = 0;
};

// How long the executor and the waiter look for work before they sleep: as long as the
// fabric's progress thread does, so a command that follows its reply within that window (a
// launch + synchronize loop) costs no futex wake-up per thread hop; longer while the client's
// keepalive asks for it through Warm's spin_us. A thread asleep in the kernel is most of an
// idle link's latency cliff.
const int kDefaultSpinUs = fabric::Options{}.spin_us;
std::atomic<int> g_spin_us{kDefaultSpinUs};

// Spins until `ready` is set or the spin window has passed (then the caller waits normally).
// The flag is read without the queue's lock, which the thread handing work over would
// otherwise find taken (1.5-2.2 us from the receive thread to the executor, H100).
void SpinFor(const std::atomic<bool>& ready) {
  const int us = g_spin_us.load(std::memory_order_relaxed);
  if (us <= 0) return;
  const auto until = Clock::now() + std::chrono::microseconds(us);
  for (SpinPause p; !ready.load(std::memory_order_acquire) && Clock::now() < until;) p.Once();
}

// The session's batches run one at a time, in arrival order, on two threads that take turns
// (leader/followers, POSA2). The thread that receives a small batch while nothing runs or
// waits in the queue runs it itself, and the reply is posted by the thread that reads the
// socket, as in a ping-pong. Handed to a second thread instead, a launch + synchronize paid
// 1.3-1.6 us for the hand-over and 1.9 for handing the reply back to the reader (H100, tcp,
// the round-trip probe at 1ed6d84); in place, its loop took 28.9 against 36.7 us (medians of
// 5 rounds, with the client's reading of its own reply, e3c27e9 against ecc7162). Meanwhile
// the other thread stands by; once the batch has run for kTakeOver it takes over receiving,
// so pings, user events, a resuming client and other servers' messages wait about that long,
// plus its wake-up if it slept (a batch may wait on the device for seconds). The standby
// spins for the worker's spin window after its last work (raised by the client's keepalive),
// then sleeps; a batch run in place after that pays a futex wake to rouse it. Other batches
// are queued and run, in order, by the standby thread, or by the one that ran the batch
// before them; released held commands (Poke) run on the standby thread when nothing else
// runs.
class Executor {
 public:
  static constexpr auto kTakeOver = std::chrono::microseconds(100);
  // Larger batches (a stream of asynchronous launches) go to the standby thread, as before:
  // run where they were received, 1000 launches took 0.4 us more each (4.95 against 4.55 us,
  // medians of 4 rounds, H100; the cause was not isolated).
  static constexpr size_t kInlineBytes = 8192;

  // in_place false: every batch runs on the standby thread, the receiving thread only
  // receives (as before this scheme). For a client under fault tolerance (--fixed-layout):
  // its replicas must place module globals at the same device addresses, and with batches
  // run by whichever thread received them, ft.cuda.bothlost's fresh replicas did not (once,
  // H100; cause not isolated: which thread makes a session's CUDA calls then depends on
  // timing, and so may the driver's host-side set-up that device addresses follow).
  Executor(Session* session, ClientLink* link, fabric::Endpoint* endpoint, const InjectOptions& inject,
           bool in_place)
      : session_(session), link_(link), endpoint_(endpoint),
        waiter_([link](std::vector<uint8_t> batch) { link->Send(std::move(batch)); }, SpinFor), inject_(inject),
        inline_bytes_(in_place ? kInlineBytes : 0) {}
  // --inject-stall-after: set once the session stopped answering (the receiving thread then
  // drops everything, pings included, as a frozen process would).
  bool stalled() const { return stalled_.load(); }

  // Starts the second thread, standing by. `receive` is the receiving loop: a thread runs it
  // while it receives, and it returns when Dispatch says that thread gave receiving up.
  void Start(const std::function<void()>* receive) {
    receive_ = receive;
    session_->set_waiter_idle([this] { return waiter_.Idle(); });
    session_->set_wake([this] { Poke(); });
    waiter_.Start();
    // Detached, like the waiter: the process ends by _exit, whichever thread receives then.
    std::thread([this] { NameThisThread("tdm-serve"); Work(); }).detach();
  }
  // Both threads' life once the session runs (the first receiving thread calls it when it
  // gives receiving up): serving, and receiving after a take-over, until the process ends.
  [[noreturn]] void Work() {
    for (;;) {
      Serve();
      (*receive_)();
    }
  }
  // A batch the receiving thread took: run here when nothing runs or waits, else queued.
  // False: the other thread took over receiving meanwhile, and this one must leave receive().
  bool Dispatch(std::vector<uint8_t> msg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (msg.size() > inline_bytes_ || running_ || !queue_.empty() || poked_ || goodbye_.load()) {
        queue_.push_back(std::move(msg));
        SignalLocked();
        return true;
      }
      running_ = true;
      inline_since_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      // The standby watches this without the lock (it would make the thread here wait for it);
      // only a sleeping one needs waking.
      inline_.store(true, std::memory_order_release);
      if (sleeping_) cv_.notify_one();
    }
    Run(&msg);
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    inline_.store(false, std::memory_order_release);
    const bool still_receiving = !taken_;
    taken_ = false;
    // Releases poked meanwhile wait for the standby (queued batches come only after a
    // take-over, and then this thread serves them).
    if (!queue_.empty() || poked_ || goodbye_.load()) SignalLocked();
    return still_receiving;
  }
  // Held commands were released (Session::RunReleased has work): any thread.
  void Poke() {
    std::lock_guard<std::mutex> lock(mu_);
    poked_ = true;
    SignalLocked();
  }
  // The session said goodbye: nothing more runs, and the receiving thread winds up.
  bool goodbye() const { return goodbye_.load(); }

 private:
  // Work for the standby (under mu_): it looks at ready_ without the lock a while, then
  // sleeps on cv_, so only a sleeping one costs a wake-up.
  void SignalLocked() {
    ready_.store(true, std::memory_order_release);
    if (sleeping_) cv_.notify_one();
  }
  bool InlineTooLong() const {
    return Clock::now().time_since_epoch().count() - inline_since_.load(std::memory_order_relaxed) >=
           std::chrono::duration_cast<Clock::duration>(kTakeOver).count();
  }

  // Runs queued batches and releases; returns when this thread takes over receiving.
  void Serve() {
    for (;;) {
      // Watches without the lock: for work (ready_), and for a batch run by the receiving
      // thread that has run too long. The spin window applies while nothing runs there.
      const int spin_us = g_spin_us.load(std::memory_order_relaxed);
      auto until = Clock::now() + std::chrono::microseconds(spin_us);
      for (SpinPause p; !ready_.load(std::memory_order_acquire); p.Once()) {
        if (inline_.load(std::memory_order_acquire)) {
          if (InlineTooLong()) break;
          until = Clock::now() + std::chrono::microseconds(spin_us);  // counted from its end
        } else if (Clock::now() >= until) {
          break;
        }
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (goodbye_.load()) {
        // The end: the receiving thread winds the session up and exits the process.
        sleeping_ = true;
        cv_.wait(lock, [] { return false; });
      }
      if (!running_ && (!queue_.empty() || poked_)) {
        std::vector<uint8_t> msg;
        const bool batch = !queue_.empty();  // a batch first: HandleBatch takes the releases too
        if (batch) {
          msg = std::move(queue_.front());
          queue_.pop_front();
        }
        poked_ = false;
        running_ = true;
        lock.unlock();
        Run(batch ? &msg : nullptr);
        lock.lock();
        running_ = false;
        continue;
      }
      if (inline_.load(std::memory_order_relaxed)) {
        if (!taken_ && InlineTooLong()) {
          taken_ = true;  // the receiving thread is held up in its batch: receive in its place
          return;
        }
        // Watch it again; what was poked meanwhile is signalled again at its end.
        ready_.store(false, std::memory_order_relaxed);
        continue;
      }
      // Nothing for now (what is poked while a batch runs is signalled again at its end).
      ready_.store(false, std::memory_order_relaxed);
      if (spin_us > 0 && Clock::now() < until) continue;
      sleeping_ = true;
      cv_.wait(lock, [this] { return ready_.load(std::memory_order_relaxed) || inline_.load(std::memory_order_relaxed); });
      sleeping_ = false;
    }
  }

  // One batch (or, msg null, the released commands): on the thread that holds running_.
  void Run(std::vector<uint8_t>* msg) {
    BatchOutcome out = msg ? session_->HandleBatch(*msg) : session_->RunReleased();
    const uint64_t run = session_->commands_run();
    if (inject_.exit_after && run >= inject_.exit_after) {
      log::Warn("fault injection: the worker dies after {} commands", run);
      ::_exit(3);
    }
    if (inject_.stall_after && run >= inject_.stall_after) {
      log::Warn("fault injection: the session stops answering after {} commands", run);
      stalled_.store(true);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    if (!out.reply.empty()) link_->Send(std::move(out.reply));
    // After the batch's own replies, so replies leave in the order of their commands.
    if (!out.late.empty()) waiter_.Push(std::move(out.late));
    if (out.goodbye) {
      goodbye_.store(true);
      endpoint_->Interrupt();  // a thread waiting in Next() sees it and winds up
    }
  }

  Session* session_;
  ClientLink* link_;
  fabric::Endpoint* endpoint_;
  const std::function<void()>* receive_ = nullptr;
  LateReplies waiter_;
  InjectOptions inject_;
  const size_t inline_bytes_;  // largest batch run where it was received (0: none)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<uint8_t>> queue_;  // batches waiting for the one that runs
  bool running_ = false;   // a thread is in the session (a batch or the releases)
  bool poked_ = false;     // released commands wait to run
  bool taken_ = false;     // the standby took over receiving during the current inline batch
  bool sleeping_ = false;  // the standby sleeps on cv_
  std::atomic<Clock::rep> inline_since_{0};  // when that batch started (written under mu_)
  std::atomic<bool> inline_{false};          // the receiving thread runs a batch itself (written under mu_)
  std::atomic<bool> ready_{false};   // something for the standby to look at (written under mu_)
  std::atomic<bool> goodbye_{false};
  std::atomic<bool> stalled_{false};
};

// A resumable client's request batch, as the receive thread takes it: records it already
// took (resent after a reconnect: seq <= taken) are dropped. False: nothing new in it.
bool TakeNew(std::vector<uint8_t>& msg, std::atomic<uint64_t>& taken) {
  std::vector<ir::Record> records;
  // A malformed batch goes on to the executor, which answers it.
  if (!ir::ParseBatch(msg, ir::BatchKind::kRequests, &records).ok() || records.empty()) return true;
  const uint64_t before = taken.load();
  uint64_t top = before;
  size_t old = 0;
  for (const ir::Record& r : records) {
    if (r.header.seq != 0 && r.header.seq <= before) ++old;
    top = std::max(top, r.header.seq);
  }
  if (old == records.size()) {
    log::Debug("dropped a resent batch of {} records (#{}..#{}): already taken", records.size(),
               records.front().header.seq, records.back().header.seq);
    return false;
  }
  if (old) {
    ir::BatchWriter w(ir::BatchKind::kRequests);
    for (const ir::Record& r : records)
      if (r.header.seq == 0 || r.header.seq > before) w.AddRaw(r.header.opcode, r.header.flags, r.header.seq, r.payload);
    msg = w.Finish();
    log::Debug("dropped {} already taken records of a resent batch", old);
  }
  taken.store(top);
  return true;
}

// Whether `msg` is a Resume alone; fills its record's seq and the request.
bool IsResume(std::span<const uint8_t> msg, uint64_t* seq, ir::ResumeReq* req) {
  std::vector<ir::Record> records;
  if (!ir::ParseBatch(msg, ir::BatchKind::kRequests, &records).ok() || records.size() != 1 ||
      records[0].header.opcode != static_cast<uint16_t>(ir::Opcode::kResume))
    return false;
  *seq = records[0].header.seq;
  return ir::DecodeRequest(records[0].payload, req).ok();
}

void Refuse(fabric::Endpoint& ep, fabric::PeerId peer, const std::string& why) {
  ir::BatchWriter out(ir::BatchKind::kReplies);
  out.AddReply<ir::PingRep>(0, 0, Status(Code::kAuth, why), {}, nullptr);
  Status st = ep.Send(peer, out.Finish());
  if (!st.ok()) log::Debug("cannot answer a refused peer: {}", st.ToString());
  ep.Close(peer);
}

}  // namespace

int RunWorker(const WorkerOptions& opt) {
  log::SetComponent("tandemd-worker");
  std::string chosen;
  auto backend = OpenBackend(opt.backend, BackendOptions{opt.devices}, &chosen);
  if (!backend.ok()) {
    Report(opt.status_fd, "error " + backend.status().ToString());
    return 1;
  }
  if (opt.probe) {
    Report(opt.status_fd, fmt::format("ok 0 {} {}", chosen, backend.value()->name()));
    return 0;
  }
  if (opt.fixed_layout) {
    const int persona = ::personality(0xffffffff);
    if (persona == -1 || !(persona & ADDR_NO_RANDOMIZE))
      log::Warn("the client runs fault tolerance, but address randomization could not be turned off here: module "
                "globals may lie at different device addresses on its replicas, and then cannot be used");
  }

  fabric::Options fo;
  fo.listen = WithPort(opt.bind_host, "0");
  auto opened = fabric::Endpoint::Open(fo);
  if (!opened.ok()) {
    Report(opt.status_fd, "error " + opened.status().ToString());
    return 1;
  }
  std::unique_ptr<fabric::Endpoint> ep = std::move(opened.value());
  Report(opt.status_fd, fmt::format("ok {} {} {}", ep->port(), chosen, backend.value()->name()));
  ::close(opt.status_fd);
  log::Info("session worker on {} ({}), waiting for Attach", ep->address(), backend.value()->name());

  Session session(backend.value().get(), opt.session_key, /*defer_replies=*/true);
  FabricPeerLink peers(ep.get(), opt.session_timeout);
  session.set_peers(&peers);
  // A client with keepalive on asks the worker to keep looking for messages between its
  // warm-ups, so an idle link answers as fast as a busy one.
  session.set_spin_hook([ep = ep.get(), current = -1](uint32_t spin_us) mutable {
    const int want = std::max<int>(fabric::Options{}.spin_us, static_cast<int>(spin_us));
    if (want != current) ep->SetSpin(current = want);
    g_spin_us.store(std::max<int>(kDefaultSpinUs, static_cast<int>(spin_us)));
  });
  session.set_faults(FaultInjection{.bitflip_rate = opt.inject.bitflip_rate, .bitflip_per_s = opt.inject.bitflip_per_s, .seed = 0});
  ClientLink link(ep.get());
  Executor executor(&session, &link, ep.get(), opt.inject, /*in_place=*/!opt.fixed_layout);
  ClientBulk bulk(ep.get(), opt.session_timeout, opt.session_grace, opt.inject.cut_bulk_every,
                  [b = backend.value().get()](size_t n) { return b->BulkStaging(n); });
  bool attached = false;
  bool connected = false;  // false while a resumable client's link is down
  fabric::PeerId client = 0;
  bool down = false;  // the client's link broke at lost_at; waiting for its Resume
  Clock::time_point lost_at{};
  auto last_heard = Clock::now();
  // The receiving loop, and at its end the session's. Once the session runs, the two threads of
  // the Executor take turns at it: each runs it while it receives.
  std::function<void()> receive;
  receive = [&] {
    // An unattached worker waits as long as an idle session would, then gives up.
    for (;;) {
      if (executor.goodbye()) break;
      auto ev = ep->Next(std::chrono::milliseconds(200));
      if (!ev.ok()) {
        if (ev.status().code() != Code::kTimeout) EndNow("endpoint failed: " + ev.status().ToString());
        if (down) {
          if (Clock::now() - lost_at > opt.session_grace)
            EndNow(fmt::format("the client did not resume within {} ms (--session-grace-ms)", opt.session_grace.count()));
        } else if (Clock::now() - last_heard > opt.session_timeout) {
          EndNow(fmt::format("nothing heard from the client for {} ms", opt.session_timeout.count()));
        }
        continue;
      }
      fabric::Event& e = ev.value();
      if (e.kind == fabric::EventKind::kPeerLost) {
        if (connected && e.peer == client) {
          if (!link.resumable()) EndNow("client lost: " + e.status.ToString());
          // Maybe only the link broke: the session waits for the client to resume it.
          log::Warn("client lost ({}); the session waits {} ms for it to resume", e.status.message(),
                    opt.session_grace.count());
          link.Lost();
          bulk.Lost();
          ep->Close(client);
          connected = false;
          down = true;
          lost_at = Clock::now();
          continue;
        }
        peers.OnPeerLost(e.peer, e.status);
        continue;
      }
      if (attached && (!connected || e.peer != client)) {
        uint64_t seq = 0;
        ir::ResumeReq resume;
        if (link.resumable() && IsResume(e.data, &seq, &resume)) {
          if (resume.session_key != opt.session_key) {
            Refuse(*ep, e.peer, "Resume with the wrong session key");
            continue;
          }
          if (connected) {  // it noticed the loss first: the old connection is dead
            log::Warn("the client resumes on a new connection; the old one is dropped");
            link.Lost();
            bulk.Lost();
            ep->Close(client);
            connected = false;
            if (!down) lost_at = Clock::now();
            down = true;
          }
          size_t resent = 0;
          Status st = link.Resume(e.peer, seq, resume.received, &resent);
          if (!st.ok()) {
            log::Error("cannot resume the session: {}", st.ToString());
            ep->Close(e.peer);
            continue;
          }
          client = e.peer;
          connected = true;
          bulk.Connect(e.peer);
          log::Info("client resumed after {} ms: it had {} reply batches, {} resent; requests up to #{} were taken",
                    std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - lost_at).count(),
                    resume.received, resent, link.taken.load());
          down = false;
          last_heard = Clock::now();
          continue;
        }
        // Another session's worker pulling or sending a server-to-server copy.
        if (!peers.OnMessage(e.peer, std::move(e.data))) Refuse(*ep, e.peer, "this session belongs to another client");
        continue;
      }
      if (!attached) {
        // Before Attach the executor is idle: the first batch is authenticated right here.
        std::vector<ir::Record> first;
        const bool resumable = ir::ParseBatch(e.data, ir::BatchKind::kRequests, &first).ok() && !first.empty() &&
                               (first[0].header.flags & ir::kRecordResumable);
        bulk.Connect(e.peer);
        backend.value()->set_bulk(&bulk, /*client=*/true);
        BatchOutcome out = session.HandleBatch(e.data);
        if (!out.reply.empty()) {
          Status st = ep->Send(e.peer, std::move(out.reply));
          if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
        }
        for (LateReply& late : out.late) {  // the waiter is not started yet: finish them here
          Status st = ep->Send(e.peer, late());
          if (!st.ok()) log::Warn("cannot send a reply: {}", st.ToString());
        }
        if (out.refuse_peer) {
          backend.value()->set_bulk(nullptr);
          bulk.Lost();
          ep->Close(e.peer);
          continue;
        }
        attached = true;
        connected = true;
        client = e.peer;
        link.Start(e.peer, resumable);
        last_heard = Clock::now();
        if (out.goodbye) break;
        executor.Start(&receive);
        continue;
      }
      last_heard = Clock::now();
      if (executor.stalled()) continue;  // frozen: not even a ping is answered
      if (link.resumable() && !TakeNew(e.data, link.taken)) continue;  // resent, already taken
      if (auto urgent = session.RunUrgent(e.data)) {
        if (!urgent->empty()) link.Send(std::move(*urgent));
        continue;
      }
      // False: this thread ran the batch, and the other one took over receiving meanwhile.
      if (!executor.Dispatch(std::move(e.data))) return;
    }
    // Goodbye: the session is done (no batch runs after it). Ending the process frees the
    // session at once; an in-process teardown of a GPU driver's contexts can take seconds
    // the broker would count as a live session.
    // The goodbye's answer may still sit in the provider's send queue, and the client waits
    // for it before it exits: the worker ends when the client hangs up, or after 1 s.
    for (const auto until = Clock::now() + std::chrono::seconds(1); connected && Clock::now() < until;) {
      auto ev = ep->Next(std::chrono::milliseconds(50));
      if (ev.ok() && ev.value().kind == fabric::EventKind::kPeerLost && ev.value().peer == client) break;
      if (!ev.ok() && ev.status().code() != Code::kTimeout) break;
    }
    EndNow("goodbye");
  };
  receive();
  executor.Work();  // this thread gave receiving up: it serves and receives by turns from now on
}

}  // namespace tandem::server
