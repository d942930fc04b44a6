// An in-memory backend for the session tests and the fuzzer: buffers are host vectors,
// every field is validated the way a real backend must, and calls are counted. It lets
// the session layer (dispatch, deferred errors, failed events) run without any GPU API.
#pragma once

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "tandem/server/backend.h"

namespace tandem::test {

class MemoryBackend : public server::Backend {
 public:
  std::string name() const override { return "memory"; }
  uint32_t device_count() const override { return 1; }

  int calls = 0;
  std::vector<std::pair<uint32_t, std::string>> pending_output;

  std::vector<std::pair<uint32_t, std::string>> TakeOutput() override {
    std::vector<std::pair<uint32_t, std::string>> out;
    out.swap(pending_output);
    return out;
  }

  Status OnBufferAlloc(const ir::BufferAllocReq& r, ir::BufferAllocRep*) override {
    ++calls;
    if (r.buffer == 0 || buffers_.contains(r.buffer)) return Status::Invalid(fmt::format("bad handle {}", r.buffer));
    if (r.device != 0) return Status::Invalid("no such device");
    if (r.size == 0 || r.size > (64u << 20)) return Status::Invalid("bad size");
    buffers_[r.buffer].assign(r.size, 0);
    return Status::Ok();
  }
  Status OnBufferFree(const ir::BufferFreeReq& r, ir::BufferFreeRep*) override {
    ++calls;
    return buffers_.erase(r.buffer) ? Status::Ok() : Status::Unknown("unknown buffer");
  }
  Status OnBufferWrite(const ir::BufferWriteReq& r, ir::BufferWriteRep*) override {
    ++calls;
    auto* b = Find(r.buffer, r.offset, r.size);
    if (!b) return Status::Invalid("bad buffer range");
    if (r.data.size() != r.size) return Status::Invalid("data size mismatch");
    std::copy(r.data.begin(), r.data.end(), b->begin() + static_cast<ptrdiff_t>(r.offset));
    return Signal(r.signal);
  }
  Status OnBufferRead(const ir::BufferReadReq& r, ir::BufferReadRep* rep) override {
    ++calls;
    auto* b = Find(r.buffer, r.offset, r.size);
    if (!b) return Status::Invalid("bad buffer range");
    rep->data.assign(b->begin() + static_cast<ptrdiff_t>(r.offset),
                     b->begin() + static_cast<ptrdiff_t>(r.offset + r.size));
    return Signal(r.signal);
  }
  Status OnBufferCopy(const ir::BufferCopyReq& r, ir::BufferCopyRep*) override {
    ++calls;
    auto* s = Find(r.src, r.src_offset, r.size);
    auto* d = Find(r.dst, r.dst_offset, r.size);
    if (!s || !d) return Status::Invalid("bad copy range");
    std::copy_n(s->begin() + static_cast<ptrdiff_t>(r.src_offset), r.size,
                d->begin() + static_cast<ptrdiff_t>(r.dst_offset));
    return Signal(r.signal);
  }
  Status OnBufferFill(const ir::BufferFillReq& r, ir::BufferFillRep*) override {
    ++calls;
    auto* b = Find(r.buffer, r.offset, r.size);
    const size_t p = r.pattern.size();
    if (!b || p == 0 || r.size % p) return Status::Invalid("bad fill");
    for (uint64_t i = 0; i < r.size; ++i) (*b)[r.offset + i] = r.pattern[i % p];
    return Signal(r.signal);
  }
  Status OnEventCreate(const ir::EventCreateReq& r, ir::EventCreateRep*) override {
    ++calls;
    if (r.event == 0 || events_.contains(r.event)) return Status::Invalid("bad event handle");
    events_[r.event] = 0;
    return Status::Ok();
  }
  Status OnEventDestroy(const ir::EventDestroyReq& r, ir::EventDestroyRep*) override {
    ++calls;
    return events_.erase(r.event) ? Status::Ok() : Status::Unknown("unknown event");
  }
  Status OnEventQuery(const ir::EventQueryReq& r, ir::EventQueryRep* rep) override {
    ++calls;
    auto it = events_.find(r.event);
    if (it == events_.end()) return Status::Unknown("unknown event");
    rep->status = it->second;
    return Status::Ok();
  }
  Status OnEventWait(const ir::EventWaitReq& r, ir::EventWaitRep* rep) override {
    ++calls;
    for (uint64_t e : r.events) {
      auto it = events_.find(e);
      if (it == events_.end()) return Status::Unknown("unknown event");
      rep->statuses.push_back(it->second);
    }
    return Status::Ok();
  }
  Status OnStreamSync(const ir::StreamSyncReq&, ir::StreamSyncRep*) override {
    ++calls;
    return Status::Ok();
  }
  Status OnDeviceSync(const ir::DeviceSyncReq& r, ir::DeviceSyncRep*) override {
    ++calls;
    return r.device == 0 ? Status::Ok() : Status::Invalid("no such device");
  }
  // Keepalive: the bytes come back, as through a device's write and read back.
  int warms = 0;
  Status OnWarm(const ir::WarmReq& r, ir::WarmRep* rep) override {
    ++calls;
    ++warms;
    if (r.device != 0) return Status::Invalid("no such device");
    rep->data = r.data;
    return Status::Ok();
  }

 private:
  std::vector<uint8_t>* Find(uint64_t h, uint64_t off, uint64_t size) {
    auto it = buffers_.find(h);
    if (it == buffers_.end() || size == 0 || off > it->second.size() || size > it->second.size() - off) return nullptr;
    return &it->second;
  }
  Status Signal(uint64_t e) {
    if (e) events_[e] = 0;
    return Status::Ok();
  }
  std::map<uint64_t, std::vector<uint8_t>> buffers_;
  std::map<uint64_t, int32_t> events_;
};

}  // namespace tandem::test
