// Host <-> device data movement shared by both front ends. Small transfers travel inline
// in the command or its reply; large ones are moved by the server with RMA directly
// from/to the program's memory, so nothing is copied on the client.
#include <condition_variable>
#include <mutex>

#include "tandem/client/completion.h"
#include "tandem/client/runtime.h"
#include "stats.h"
#include "tandem/log.h"

namespace tandem::client {
namespace {

bool UseRma(Session& s, uint64_t size) { return s.rma() && size > ir::kInlineDataLimit; }

}  // namespace

Status Completion::Wait() {
  auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(m_);
  cv_.wait(l, [&] { return done_; });
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
  if (!mr.ok()) return mr.status();
  req.remote = {.addr = (*mr)->remote_addr(), .len = req.size, .key = (*mr)->key()};
  Stats::Get().rma_to_server.fetch_add(req.size, std::memory_order_relaxed);
  auto completion = blocking ? std::make_shared<Completion>() : nullptr;
  std::shared_ptr<fabric::MemoryRegion> region = std::move(mr).value();
  // The server answers once it has pulled the data; only then may the region go.
  s.Post(req, [region, completion, done = std::move(done)](const Status& st, ir::BufferWriteRep&&) mutable {
    region.reset();
    if (done) done(st);
    if (completion) completion->Set(st);
  });
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
    if (!mr.ok()) return mr.status();
    req.remote = {.addr = (*mr)->remote_addr(), .len = req.size, .key = (*mr)->key()};
    Stats::Get().rma_from_server.fetch_add(req.size, std::memory_order_relaxed);
    region = std::move(mr).value();
  } else {
    req.remote = {};
  }
  const uint64_t size = req.size;
  s.Post(req, [region, completion, dst, size, done = std::move(done)](const Status& st,
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
  });
  Status st = s.Flush();
  if (!blocking) return st;
  return completion->Wait();
}

}  // namespace tandem::client
