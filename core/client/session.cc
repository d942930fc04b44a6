#include "session.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <string_view>
#include <thread>

#include "stats.h"
#include "tandem/client/completion.h"
#include "tandem/log.h"
#include "tandem/thread_name.h"

namespace tandem::client {
namespace {
// A batch this large is sent at once.
constexpr size_t kFlushBytes = 256 * 1024;
// An idle link is pinged this often; the ping doubles as the liveness check.
constexpr auto kPingInterval = std::chrono::milliseconds(1000);

long EnvMillis(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long ms = std::strtol(v, &end, 10);
  return (end && *end == 0 && ms >= 0) ? ms : fallback;
}

// Unacknowledged request bytes past which an idle link is pinged for an Ack.
constexpr size_t kUnackedSoft = 16u << 20;

// Test only: TANDEM_TEST_CUT_LINK_AFTER=N closes each session's connection abruptly after
// every N-th batch it sent, at most TANDEM_TEST_CUT_LINK_TIMES times (default 3), to
// exercise the reconnect and resume path. Never set it in production.
struct TestCut {
  uint64_t every = 0;
  int times = 0;
};
const TestCut& TestCutFromEnv() {
  static const TestCut cut{static_cast<uint64_t>(EnvMillis("TANDEM_TEST_CUT_LINK_AFTER", 0)),
                           static_cast<int>(EnvMillis("TANDEM_TEST_CUT_LINK_TIMES", 3))};
  return cut;
}

}  // namespace

// An asynchronous command waits at most this long for companions before it is sent.
// TANDEM_EXP_FLUSH_US (an experiment's knob, not a setting; a count like the others, here
// of microseconds) overrides it.
Clock::duration FlushDelay() {
  static const Clock::duration t = std::chrono::microseconds(EnvMillis("TANDEM_EXP_FLUSH_US", 100));
  return t;
}

// Fractions of a millisecond are allowed (e.g. 0.5); 0 turns keepalive off.
Clock::duration KeepaliveInterval() {
  static const Clock::duration t = [] {
    double ms = 2;
    if (const char* v = std::getenv("TANDEM_KEEPALIVE_MS"); v && *v) {
      char* end = nullptr;
      const double parsed = std::strtod(v, &end);
      if (end && *end == 0 && parsed >= 0 && parsed < 1e6) ms = parsed;
    }
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  }();
  return t;
}

uint32_t KeepaliveSpinUs() {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::microseconds>(KeepaliveInterval()).count() +
                               1000);
}

namespace {
// Keepalive stops this long after the program's last command: a program idle for a second
// is not waiting on latency, and the link may sleep (and the spinning threads with it).
Clock::duration KeepaliveHold() {
  static const Clock::duration t = std::chrono::milliseconds(EnvMillis("TANDEM_KEEPALIVE_HOLD_MS", 1000));
  return t;
}

}  // namespace

Clock::duration FailoverTimeout() {
  static const Clock::duration t = [] {
    const char* v = std::getenv("TANDEM_FAILOVER_TIMEOUT_MS");
    long ms = v ? std::strtol(v, nullptr, 10) : 0;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(ms > 0 ? ms : 10000));
  }();
  return t;
}

SessionImpl::SessionImpl(fabric::Endpoint* ep, fabric::PeerId peer, std::string server, std::string worker_address,
                         std::string backend, std::function<void()> wake_flusher, uint64_t session_key)
    : ep_(ep), peer_(peer), server_(std::move(server)), worker_address_(std::move(worker_address)),
      backend_(std::move(backend)),
      wake_flusher_(std::move(wake_flusher)), session_key_(session_key) {}

namespace {
std::atomic<bool> g_helper_threads{false};

// TANDEM_WAIT_IN_PLACE=0: no command is flagged kRecordCallerWaits (for a program whose kernel
// waits for what another thread's first command does, and for A/B runs).
bool WaitInPlaceAllowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("TANDEM_WAIT_IN_PLACE");
    return !(v && std::string_view(v) == "0");
  }();
  return allowed;
}
}  // namespace

void NoteHelperThreads() { g_helper_threads.store(true, std::memory_order_release); }

uint64_t SessionImpl::Queue(uint16_t opcode, std::vector<uint8_t> payload, RawReplyFn fn, bool awaited) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!health_.ok()) {
    Status why = health_;
    lock.unlock();
    if (fn) fn(why, {});
    else log::Warn("{}: dropped {} ({})", server_, ir::CommandName(opcode), why.message());
    return 0;
  }
  const ir::CommandInfo* info = ir::FindCommand(opcode);
  const bool urgent = info && (info->flags & ir::kUrgent);
  // An urgent command travels alone: what was queued before it leaves first.
  if (urgent && !batch_.empty()) {
    FlushLocked(lock);  // releases the lock
    lock.lock();
    if (!health_.ok()) {  // that send lost the server: nothing will answer this one either
      Status why = health_;
      lock.unlock();
      if (fn) fn(why, {});
      return 0;
    }
  }
  // Numbered here, in the same critical section that queues it: batches then hold rising
  // seqs and leave in seq order, which the worker's duplicate filter relies on.
  uint64_t seq = next_seq_++;
  if (log::TraceEnabled()) log::Trace("-> {} #{} {}", server_, seq, ir::TraceRequest(opcode, payload));
  bool was_empty = batch_.empty();
  const Clock::time_point now = Clock::now();
  if (was_empty) batch_started_ = now;
  if (opcode != static_cast<uint16_t>(ir::Opcode::kPing) && opcode != static_cast<uint16_t>(ir::Opcode::kWarm)) {
    NoteUse(opcode, payload);
    const std::thread::id me = std::this_thread::get_id();
    if (poster_ == std::thread::id{}) poster_ = me;
    else if (poster_ != me) many_posters_ = true;
  }
  uint16_t flags = fn ? ir::kRecordWantReply : 0;
  if (awaited && fn && !many_posters_ && !g_helper_threads.load(std::memory_order_acquire) && WaitInPlaceAllowed())
    flags |= ir::kRecordCallerWaits;
  batch_.AddRaw(opcode, flags, seq, payload);
  Stats::Get().calls[opcode].fetch_add(1, std::memory_order_relaxed);
  if (fn) pending_.emplace(seq, std::move(fn));
  // A batch that has waited long enough leaves with this command, sent by the posting
  // thread: a program that posts without pause keeps this lock so busy that the flusher
  // thread rarely gets it (the lock is not fair), and its commands would wait for the sync.
  if (urgent || batch_.size() >= kFlushBytes || now - batch_started_ >= FlushDelay()) {
    Status st = FlushLocked(lock);
    if (!st.ok()) log::Warn("{}: send failed: {}", server_, st.ToString());
  } else if (was_empty) {
    lock.unlock();
    wake_flusher_();  // so the batch leaves within FlushDelay() even if no sync follows
  }
  return seq;
}

Status SessionImpl::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  return FlushLocked(lock);
}

Status SessionImpl::FlushLocked(std::unique_lock<std::mutex>& lock) {
  if (batch_.empty()) {
    Status h = health_;
    lock.unlock();
    return h;
  }
  std::vector<uint8_t> msg = batch_.Finish(/*keep_room=*/true);
  const uint64_t top = next_seq_ - 1;  // every seq below next_seq_ is in this batch or an earlier one
  last_send_ = Clock::now();
  Stats::Get().messages_sent.fetch_add(1, std::memory_order_relaxed);
  Stats::Get().bytes_sent.fetch_add(msg.size(), std::memory_order_relaxed);
  Status st;
  fabric::PeerId to = 0;
  bool cut = false;
  {
    // Taken before the state lock is released, so batches leave in seq order.
    std::lock_guard<std::mutex> send_lock(send_mu_);
    lock.unlock();
    to = peer_.load();
    if (session_key_) {
      // Kept until the worker acknowledges it: a reconnect sends it again.
      std::lock_guard<std::mutex> l(unacked_mu_);
      unacked_bytes_ += msg.size();
      unacked_size_.store(unacked_bytes_, std::memory_order_relaxed);
      unacked_.push_back({top, msg});
    }
    if (link_down_.load()) return Status::Ok();  // a reconnect is under way: it sends the batch
    st = ep_->Send(to, std::move(msg));
    const TestCut& test = TestCutFromEnv();
    if (st.ok() && session_key_ && test.every && ++sends_ % test.every == 0 && cuts_ < test.times) {
      ++cuts_;
      cut = true;
      log::Warn("{}: test: cutting the link after {} batches (TANDEM_TEST_CUT_LINK_AFTER)", server_, sends_);
      ep_->Close(to);  // test only: the connection drops under the program
    }
  }
  // Outside both locks: OnLost takes the state lock and runs the waiters' callbacks.
  if (cut) {
    OnLinkLost(to, Status(Code::kLinkLost, "cut on purpose (TANDEM_TEST_CUT_LINK_AFTER, a test-only setting)"));
    return Status::Ok();
  }
  if (!st.ok()) {
    OnLinkLost(to, Status(Code::kLinkLost, "sending to " + server_ + " failed: " + st.message()));
    if (session_key_) return Status::Ok();  // resent after the reconnect, or failed by OnLost
  }
  return st;
}

Status PostAndWait(Session& s, uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields,
                   std::unique_lock<std::mutex>* held) {
  // A Completion: with keepalive on, the caller looks for the reply a moment before sleeping
  // (a synchronize's wake-up from the kernel costs as much as its round trip's tail).
  auto done = std::make_shared<Completion>();
  s.PostRawAwaited(opcode, std::move(payload),
                   [done](const Status& st, std::span<const uint8_t> fields) { done->Set(st, fields); });
  s.Flush();
  if (held) held->unlock();
  Status st = done->Wait();
  if (reply_fields) *reply_fields = std::move(done->fields());
  return st;
}

Status SessionImpl::CallRaw(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields) {
  return PostAndWait(*this, opcode, std::move(payload), reply_fields);
}

Status Session::CallRawReleasing(uint16_t opcode, std::vector<uint8_t> payload, std::vector<uint8_t>* reply_fields,
                                 std::unique_lock<std::mutex>& held) {
  return PostAndWait(*this, opcode, std::move(payload), reply_fields, &held);
}

Result<std::unique_ptr<fabric::MemoryRegion>> SessionImpl::Register(const void* addr, size_t len,
                                                                     uint32_t access) {
  // Registration needs a writable pointer in libfabric's API even for remote reads.
  return ep_->Register(const_cast<void*>(addr), len, access);
}

std::vector<ir::AsyncError> SessionImpl::TakeAsyncErrors() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ir::AsyncError> out;
  out.swap(async_errors_);
  return out;
}

Status SessionImpl::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

bool SessionImpl::has_queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !batch_.empty();
}

void SessionImpl::OnMessage(std::span<const uint8_t> msg) {
  Stats::Get().messages_received.fetch_add(1, std::memory_order_relaxed);
  Stats::Get().bytes_received.fetch_add(msg.size(), std::memory_order_relaxed);
  std::vector<ir::Record> records;
  Status st = ir::ParseBatch(msg, ir::BatchKind::kReplies, &records);
  if (!st.ok()) {
    log::Error("{}: malformed reply batch: {}", server_, st.message());
    return;
  }
  // A resumable session's reply batches end with an Ack: which requests the worker took,
  // and the batch's number (one already seen was sent again after a reconnect: dropped).
  if (!records.empty() && records.back().header.seq == 0 &&
      records.back().header.opcode == static_cast<uint16_t>(ir::Opcode::kAck)) {
    ir::AckReq ack;
    Status as = ir::DecodeRequest(records.back().payload, &ack);
    records.pop_back();
    if (!as.ok()) {
      log::Error("{}: malformed Ack: {}", server_, as.message());
    } else {
      if (ack.reply_no <= replies_received_.load()) {
        log::Debug("{}: reply batch {} received twice: dropped", server_, ack.reply_no);
        return;
      }
      replies_received_.store(ack.reply_no);
      Trim(ack.executed);
    }
  }
  for (const ir::Record& rec : records) {
    if (rec.header.seq == 0 && rec.header.opcode == static_cast<uint16_t>(ir::Opcode::kOutput)) {
      ForwardOutput(rec.payload);
      continue;
    }
    if (rec.header.opcode == static_cast<uint16_t>(ir::Opcode::kResume) ||
        (rec.header.seq == 0 && rec.header.opcode == 0)) {
      // The answer to a reconnect's Resume (or the worker refusing the new connection).
      ir::ResumeRep rep;
      ir::PingRep refusal;
      ir::ReplyHead head;
      Status rs = rec.header.opcode == 0 ? ir::DecodeReply(rec.payload, &head, &refusal)
                                         : ir::DecodeReply(rec.payload, &head, &rep);
      std::lock_guard<std::mutex> lock(mu_);
      if (resume_state_ != ResumeState::kWaiting) {
        log::Warn("{}: unexpected {} record: {}", server_, ir::CommandName(rec.header.opcode),
                  rs.ok() ? head.status.ToString() : rs.ToString());
        continue;
      }
      if (rs.ok() && head.status.ok() && rec.header.opcode != 0) {
        resume_state_ = ResumeState::kOk;
        resume_executed_ = rep.executed;
      } else {
        resume_state_ = ResumeState::kRefused;
        resume_error_ = rs.ok() ? head.status : rs;
      }
      last_recv_ = Clock::now();
      resume_cv_.notify_all();
      continue;
    }
    ir::Reader r(rec.payload);
    ir::ReplyHead head;
    Status hs = ir::DecodeReplyHead(r, &head);
    RawReplyFn fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_recv_ = Clock::now();
      for (auto& e : head.deferred) {
        log::Debug("{}: deferred error of #{} {}: {}", server_, e.seq, ir::CommandName(static_cast<uint16_t>(e.opcode)),
                   e.message);
        async_errors_.push_back(std::move(e));
      }
      auto it = pending_.find(rec.header.seq);
      if (it != pending_.end()) {
        fn = std::move(it->second);
        pending_.erase(it);
      }
    }
    if (!hs.ok()) {
      log::Error("{}: malformed reply to #{}: {}", server_, rec.header.seq, hs.message());
      head.status = hs;
    }
    if (log::TraceEnabled())
      log::Trace("<- {} #{} {} {}", server_, rec.header.seq, ir::CommandName(rec.header.opcode), head.status.ToString());
    if (fn) fn(head.status, std::span<const uint8_t>(r.cursor(), r.remaining()));
    else if (!head.status.ok())
      log::Warn("{}: {} failed: {}", server_, ir::CommandName(rec.header.opcode), head.status.ToString());
  }
}

void SessionImpl::ForwardOutput(std::span<const uint8_t> payload) {
  if (!forward_output_.load()) return;
  // What the session's kernels printed (CUDA printf) goes to the program's own stdout/stderr.
  ir::OutputReq out;
  Status st = ir::DecodeRequest(payload, &out);
  if (!st.ok() || (out.fd != 1 && out.fd != 2)) {
    log::Error("{}: malformed output notification: {}", server_, st.ok() ? "bad fd" : st.message());
    return;
  }
  std::fflush(out.fd == 1 ? stdout : stderr);
  size_t done = 0;
  while (done < out.data.size()) {
    ssize_t n = ::write(static_cast<int>(out.fd), out.data.data() + done, out.data.size() - done);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      log::Error("{}: cannot forward server output to fd {}", server_, out.fd);
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void SessionImpl::OnLost(const Status& why) {
  if (!Close(why)) return;
  log::Error("lost server {}: {}", server_, why.message());
  if (lost_hook_) lost_hook_(this);
}

void SessionImpl::OnLinkLost(fabric::PeerId peer, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!health_.ok() || peer != peer_.load()) return;  // an old connection, or nothing to save
    if (session_key_) {
      if (reconnecting_) {  // the connection a reconnect is resuming on broke
        if (resume_state_ == ResumeState::kWaiting) {
          resume_state_ = ResumeState::kFailed;
          resume_error_ = why;
          resume_cv_.notify_all();
        }
        return;
      }
      reconnecting_ = true;
      link_down_.store(true);
    }
  }
  if (!session_key_) return OnLost(why);
  log::Warn("{}: link lost ({}); reconnecting to its session worker at {}", server_, why.message(), worker_address_);
  ep_->Close(peer);
  std::thread([this, why] { NameThisThread("tdm-reconnect"); Reconnect(why); }).detach();
}

void SessionImpl::Trim(uint64_t executed) {
  std::lock_guard<std::mutex> l(unacked_mu_);
  while (!unacked_.empty() && unacked_.front().top <= executed) {
    unacked_bytes_ -= unacked_.front().msg.size();
    unacked_.pop_front();
  }
  unacked_size_.store(unacked_bytes_, std::memory_order_relaxed);
}

bool SessionImpl::Resend(fabric::PeerId peer, uint64_t executed, size_t* resent) {
  Trim(executed);
  std::vector<std::vector<uint8_t>> again;
  {
    std::lock_guard<std::mutex> l(unacked_mu_);
    for (const Unacked& u : unacked_) again.push_back(u.msg);
  }
  *resent = 0;
  for (auto& msg : again) {
    const size_t n = msg.size();
    Status st = ep_->Send(peer, std::move(msg));
    if (!st.ok()) {
      log::Debug("{}: resending a batch: {}", server_, st.ToString());
      return false;
    }
    Stats::Get().messages_sent.fetch_add(1, std::memory_order_relaxed);
    Stats::Get().bytes_sent.fetch_add(n, std::memory_order_relaxed);
    ++*resent;
  }
  return true;
}

// Runs on a thread of its own: Connect waits, and the receiver must go on delivering the
// new connection's answer.
void SessionImpl::Reconnect(Status why) {
  const auto start = Clock::now();
  const auto deadline = start + FailoverTimeout();
  const auto ms = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d); };
  Status last = why;
  int attempts = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!health_.ok()) return;  // closed meanwhile (fault tolerance retired it)
    }
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    ++attempts;
    auto peer = ep_->Connect(worker_address_, std::min(ms(left), std::chrono::milliseconds(2000)));
    if (!peer.ok()) {
      last = peer.status();
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - Clock::now()));
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer_.store(*peer);  // its messages now reach this session
      resume_state_ = ResumeState::kWaiting;
    }
    ir::BatchWriter bw(ir::BatchKind::kRequests);
    bw.AddRequest(ir::ResumeReq{.session_key = session_key_, .received = replies_received_.load()}, 0);
    Status st = ep_->Send(*peer, bw.Finish());
    ResumeState state = ResumeState::kFailed;
    uint64_t executed = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (st.ok()) {
        resume_cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::seconds(5)),
                              [&] { return resume_state_ != ResumeState::kWaiting; });
        state = resume_state_;
        last = state == ResumeState::kWaiting ? Status(Code::kTimeout, "no answer to Resume") : resume_error_;
      } else {
        last = st;
      }
      executed = resume_executed_;
      resume_state_ = ResumeState::kIdle;
    }
    if (state == ResumeState::kOk) {
      size_t resent = 0;
      bool sent;
      {
        std::lock_guard<std::mutex> send_lock(send_mu_);
        sent = Resend(*peer, executed, &resent);
        if (sent) link_down_.store(false);
      }
      if (sent) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          reconnecting_ = false;
          last_recv_ = Clock::now();
        }
        Stats::Get().reconnects.fetch_add(1, std::memory_order_relaxed);
        Stats::Get().resent.fetch_add(resent, std::memory_order_relaxed);
        log::Warn("{}: reconnected to its session worker after {} ms ({} attempts); {} unacknowledged batches resent",
                  server_, ms(Clock::now() - start).count(), attempts, resent);
        wake_flusher_();  // what was queued meanwhile leaves now
        return;
      }
      last = Status(Code::kLinkLost, "the resumed connection broke while resending");
    }
    ep_->Close(*peer);
    if (state == ResumeState::kRefused) break;  // the worker cannot take the session back
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100),
                                                          std::max<Clock::duration>(deadline - Clock::now(), {})));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    reconnecting_ = false;
  }
  OnLost(Status(Code::kServerLost, fmt::format("link lost ({}) and its session worker at {} did not take it back "
                                               "within {} ms: {}",
                                               why.message(), worker_address_, ms(FailoverTimeout()).count(),
                                               last.message())));
}

void SessionImpl::NoteUse(uint16_t opcode, std::span<const uint8_t> payload) {
  last_program_ = Clock::now();
  auto device_at = [&](size_t offset) {
    if (payload.size() < offset + 8) return;
    uint64_t device = 0;
    std::memcpy(&device, payload.data() + offset, 8);  // fields are little-endian, as is every host we build for
    if (std::find(warm_devices_.begin(), warm_devices_.end(), device) == warm_devices_.end() && warm_devices_.size() < 64)
      warm_devices_.push_back(device);
  };
  switch (static_cast<ir::Opcode>(opcode)) {
    case ir::Opcode::kAddressReserve: device_at(0); break;
    case ir::Opcode::kBufferAlloc:
    case ir::Opcode::kStreamCreate: device_at(8); break;
    case ir::Opcode::kBufferWrite:
    case ir::Opcode::kBufferRead: warm_paths_ |= ir::kWarmCopy; break;
    case ir::Opcode::kLaunch: warm_paths_ |= ir::kWarmKernel; break;
    default: break;
  }
}

// After TANDEM_KEEPALIVE_MS of silence on a link the program still uses, one Warm per device
// it allocated on: a small copy each way if it copied, an empty kernel if it launched. The
// reply is the liveness signal too.
Clock::duration SessionImpl::Keepalive(std::unique_lock<std::mutex>& lock, Clock::time_point now) {
  const Clock::duration every = KeepaliveInterval();
  if (every == Clock::duration::zero() || !warm_paths_ || warm_devices_.empty()) return kPingInterval;
  if (now - last_program_ > KeepaliveHold()) return kPingInterval;
  if (ping_outstanding_ || !pending_.empty() || !batch_.empty()) return every;
  const Clock::time_point quiet_since = std::max(last_send_, last_recv_);
  if (now - quiet_since < every) return every - (now - quiet_since);
  ping_outstanding_ = true;
  probe_sent_ = now;
  warm_left_ = static_cast<int>(warm_devices_.size());
  const uint32_t paths = warm_paths_;
  const std::vector<uint64_t> devices = warm_devices_;
  lock.unlock();
  for (uint64_t device : devices) {
    ir::WarmReq warm{.device = device, .what = paths, .spin_us = KeepaliveSpinUs(), .data = ir::bytes(8, 0x5a)};
    PostRaw(static_cast<uint16_t>(ir::Opcode::kWarm), ir::Encode(warm), [this](const Status& st, auto) {
      if (!st.ok()) log::Debug("{}: keepalive: {}", server_, st.message());
      Stats::Get().keepalives.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> l(mu_);
      if (--warm_left_ <= 0) ping_outstanding_ = false;
    });
  }
  Flush();
  return every;
}

bool SessionImpl::Close(const Status& why) {
  std::map<uint64_t, RawReplyFn> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!health_.ok()) return false;
    health_ = why;
    failed.swap(pending_);
  }
  for (auto& [seq, fn] : failed) fn(why, {});
  return true;
}

Clock::duration SessionImpl::Tick(Clock::time_point now) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!health_.ok()) return kPingInterval;
  if (reconnecting_) {
    // The reconnect owns the deadline; batches are only kept meanwhile.
    if (!batch_.empty()) FlushLocked(lock);
    return std::chrono::milliseconds(50);
  }
  // Liveness first, so a session kept busy by a posting thread still notices a server
  // that stopped answering. Silence counts from when the probe was sent: a server nobody asked
  // anything for a while (this thread held up by another server's send, say) has not failed to
  // answer for that while.
  if (ping_outstanding_ && now - std::max(last_recv_, probe_sent_) > FailoverTimeout()) {
    lock.unlock();
    OnLost(Status(Code::kServerLost, "no answer for " +
                                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                            FailoverTimeout()).count()) + " ms"));
    return kPingInterval;
  }
  if (!batch_.empty()) {
    auto due = batch_started_ + FlushDelay();
    if (now < due) return due - now;
    FlushLocked(lock);
    return KeepaliveInterval() != Clock::duration::zero() ? std::min<Clock::duration>(KeepaliveInterval(), kPingInterval)
                                                          : Clock::duration(kPingInterval);
  }
  Clock::duration next = kPingInterval;
  if (KeepaliveInterval() != Clock::duration::zero()) {
    next = std::min<Clock::duration>(next, Keepalive(lock, now));  // unlocks when it sends
    if (!lock.owns_lock()) return next;
  }
  // Probe a link that has been quiet for a while: when idle, or when replies are awaited.
  const bool awaited = !pending_.empty();
  // A stream of commands that need no reply gets no Ack: a ping asks for one.
  const bool unacked = unacked_size_.load(std::memory_order_relaxed) > kUnackedSoft;
  if (!ping_outstanding_ &&
      (unacked || (now - last_recv_ > kPingInterval && (awaited || now - last_send_ > kPingInterval)))) {
    ping_outstanding_ = true;
    probe_sent_ = now;
    lock.unlock();
    ir::PingReq ping{.nonce = static_cast<uint64_t>(now.time_since_epoch().count())};
    PostRaw(static_cast<uint16_t>(ir::Opcode::kPing), ir::Encode(ping), [this](const Status&, auto) {
      std::lock_guard<std::mutex> l(mu_);
      ping_outstanding_ = false;
    });
    Flush();
  }
  return next;
}

}  // namespace tandem::client
