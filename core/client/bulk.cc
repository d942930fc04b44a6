// Host <-> device data movement shared by both front ends. Small transfers travel inline
// in the command or its reply; large ones are moved by the server with RMA directly
// from/to the program's memory, so nothing is copied on the client.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <mutex>

#include "tandem/client/completion.h"
#include "tandem/client/runtime.h"
#include "tandem/spin.h"
#include "session.h"
#include "stats.h"
#include "tandem/log.h"

namespace tandem::client {
namespace {

bool UseRma(Session& s, uint64_t size) { return s.rma() && size > ir::kInlineDataLimit; }

}  // namespace

Status Completion::Wait() {
  auto start = std::chrono::steady_clock::now();
  // With keepalive the reply usually comes within the spin window: look for it before
  // sleeping (a wake-up from the kernel is a good part of a small read back's latency).
  if (KeepaliveInterval() != Clock::duration::zero()) {
    const auto until = start + std::chrono::microseconds(200);
    HelpReceive(done_, until);  // the reply read and delivered on this thread: no hand-over
    for (SpinPause p; !done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until;) p.Once();
  }
  // Seen while spinning: Set() wrote the reply before the flag, and may still hold m_ (taken
  // now, this thread would sleep on it and Set's unlock would have to wake it).
  if (!done_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return done_.load(std::memory_order_relaxed); });
  }
  Stats::Get().AddWait(std::chrono::steady_clock::now() - start);
  return status_;
}

Status WriteBuffer(Session& s, ir::BufferWriteReq req, const void* src, bool blocking,
                   std::function<void(const Status&)> done) {
  if (!UseRma(s, req.size)) {
    // Posted without a reply: a lost server must be reported here, not as a silent drop.
    if (Status h = s.health(); !h.ok()) {
      if (done) done(h);
      return h;
    }
    const auto* p = static_cast<const uint8_t*>(src);
    req.data.assign(p, p + req.size);
    req.remote = {};
    // The bytes are copied into the command: the caller's memory is free at once.
    s.Post(req);
    if (done) done(Status::Ok());
    return Status::Ok();
  }
  auto mr = s.Register(src, req.size, fabric::kRemoteRead);
  if (!mr.ok()) {
    if (done) done(mr.status());
    return mr.status();
  }
  req.remote = {.addr = (*mr)->remote_addr(), .len = req.size, .key = (*mr)->key()};
  Stats::Get().rma_to_server.fetch_add(req.size, std::memory_order_relaxed);
  auto completion = blocking ? std::make_shared<Completion>() : nullptr;
  std::shared_ptr<fabric::MemoryRegion> region = std::move(mr).value();
  // The server answers once it has pulled the data; only then may the region go.
  auto reply = [region, completion, done = std::move(done)](const Status& st, ir::BufferWriteRep&&) mutable {
    region.reset();
    if (done) done(st);
    if (completion) completion->Set(st);
  };
  s.Post(req, std::move(reply), blocking);
  if (!blocking) return s.Flush();
  s.Flush();
  return completion->Wait();
}

Status ReadBuffer(Session& s, ir::BufferReadReq req, void* dst, bool blocking,
                  std::function<void(const Status&)> done) {
  auto completion = blocking ? std::make_shared<Completion>() : nullptr;
  std::shared_ptr<fabric::MemoryRegion> region;
  if (UseRma(s, req.size)) {
    auto mr = s.Register(dst, req.size, fabric::kRemoteWrite);
    if (!mr.ok()) {
      if (done) done(mr.status());
      return mr.status();
    }
    req.remote = {.addr = (*mr)->remote_addr(), .len = req.size, .key = (*mr)->key()};
    Stats::Get().rma_from_server.fetch_add(req.size, std::memory_order_relaxed);
    region = std::move(mr).value();
  } else {
    req.remote = {};
  }
  const uint64_t size = req.size;
  auto reply = [region, completion, dst, size, done = std::move(done)](const Status& st,
                                                                        ir::BufferReadRep&& rep) mutable {
    Status result = st;
    if (result.ok() && !region) {
      if (rep.data.size() != size)
        result = Status::Protocol("read reply carries " + std::to_string(rep.data.size()) + " bytes, expected " +
                                  std::to_string(size));
      else
        std::memcpy(dst, rep.data.data(), size);
    }
    region.reset();
    if (done) done(result);
    if (completion) completion->Set(result);
  };
  s.Post(req, std::move(reply), blocking);
  Status st = s.Flush();
  if (!blocking) return st;
  return completion->Wait();
}

namespace {
std::atomic<bool> g_direct_copies_disabled{false};
}  // namespace

bool DirectCopiesEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("TANDEM_VDMA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on && !g_direct_copies_disabled.load();
}

void DisableDirectCopies() { g_direct_copies_disabled.store(true); }

uint64_t NewTransferId() {
  static std::mutex mu;
  static std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  std::lock_guard<std::mutex> lock(mu);
  uint64_t id;
  do id = rng(); while (id == 0);
  return id;
}

Status ImportEvent(Session& from, uint64_t event, Session& to, uint32_t device, uint64_t stand_in) {
  if (!DirectCopiesEnabled()) {
    Stats::Get().events_waited_here.fetch_add(1, std::memory_order_relaxed);  // the caller waits instead
    return Status(Code::kUnimplemented, "direct links between servers are off");
  }
  if (&from == &to) return Status(Code::kInternal, "ImportEvent within one session");
  const uint64_t token = NewTransferId();
  from.Post(ir::EventExportReq{.event = event, .token = token});
  to.Post(ir::EventImportReq{.event = stand_in, .device = device, .peer = from.worker_address(), .token = token});
  Stats::Get().events_imported.fetch_add(1, std::memory_order_relaxed);
  // The exporter starts watching at once; the importer's own commands follow in its batch.
  return from.Flush();
}

uint64_t StandIns::On(Session& from, uint64_t event, Session& to, uint32_t device) {
  for (const auto& [session, stand_in] : made_)
    if (session == &to) return stand_in;
  const uint64_t stand_in = Runtime::Get().NewHandle();
  if (!ImportEvent(from, event, to, device, stand_in).ok()) return 0;
  made_.emplace_back(&to, stand_in);
  return stand_in;
}

void StandIns::Drop() {
  for (const auto& [session, stand_in] : made_) session->Post(ir::EventDestroyReq{.event = stand_in});
  made_.clear();
}

Status CopyBetweenServers(const CopyEnd& src, const CopyEnd& dst, uint64_t size, uint64_t signal) {
  if (!src.session || !dst.session) return Status(Code::kInternal, "CopyBetweenServers without a session");
  if (size == 0) return Status::Ok();
  // Two devices of one server (OpenCL keeps one context per device there) are relayed too.
  if (DirectCopiesEnabled() && src.session != dst.session) {
    const uint64_t transfer = NewTransferId();
    // The destination first: its PeerRecv blocks only its own queue until the bytes come.
    dst.session->Post(ir::PeerRecvReq{.stream = dst.stream, .buffer = dst.buffer, .offset = dst.offset, .size = size,
                                      .peer = src.session->worker_address(), .transfer = transfer, .wait = dst.wait,
                                      .signal = signal});
    src.session->Post(ir::PeerSendReq{.stream = src.stream, .buffer = src.buffer, .offset = src.offset, .size = size,
                                      .transfer = transfer, .wait = src.wait, .signal = 0});
    Stats::Get().server_to_server.fetch_add(size, std::memory_order_relaxed);
    Status a = dst.session->Flush();
    Status b = src.session->Flush();
    return a.ok() ? b : a;
  }
  auto staging = std::make_shared<std::vector<uint8_t>>(size);
  TANDEM_RETURN_IF_ERROR(ReadBuffer(*src.session,
                                    ir::BufferReadReq{.stream = src.stream, .buffer = src.buffer, .offset = src.offset,
                                                      .size = size, .remote = {}, .wait = src.wait, .signal = 0},
                                    staging->data(), /*blocking=*/true));
  Stats::Get().relayed.fetch_add(size, std::memory_order_relaxed);
  return WriteBuffer(*dst.session,
                     ir::BufferWriteReq{.stream = dst.stream, .buffer = dst.buffer, .offset = dst.offset, .size = size,
                                        .data = {}, .remote = {}, .wait = dst.wait, .signal = signal},
                     staging->data(), /*blocking=*/false, [staging](const Status&) {});
}

}  // namespace tandem::client
