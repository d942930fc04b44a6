// What the backend fuzz targets (opencl_backend_fuzz.cc, cuda_backend_fuzz.cc) share: the
// client's memory as RMA sees it, and the reader that turns fuzz bytes into fields (sizes
// drawn small, near 4 KiB or 1 MiB, or near 2^64; handles from small pools, so commands meet
// each other's objects: buffers 1-7, streams 0-4 (0: the default), events 100-106).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/server/backend.h"

namespace tandem::test {

// The client's memory as RMA sees it: a 64 KiB region at address 0; anything past it is
// refused as a real client's key check would.
class BoundedBulk : public server::BulkIO {
 public:
  Status Pull(const ir::Region& remote, size_t len,
              const std::function<Status(const uint8_t*, size_t, size_t)>& sink) override {
    if (!Inside(remote, len)) return Status::Invalid("outside the client's memory");
    for (size_t off = 0; off < len; off += 4096) {
      TANDEM_RETURN_IF_ERROR(sink(mem_ + remote.addr + off, off, std::min<size_t>(4096, len - off)));
    }
    return Status::Ok();
  }
  Status Push(const ir::Region& remote, size_t len,
              const std::function<Status(uint8_t*, size_t, size_t)>& source) override {
    if (!Inside(remote, len)) return Status::Invalid("outside the client's memory");
    for (size_t off = 0; off < len; off += 4096) {
      TANDEM_RETURN_IF_ERROR(source(mem_ + remote.addr + off, off, std::min<size_t>(4096, len - off)));
    }
    return Status::Ok();
  }

 private:
  static constexpr size_t kSize = 64 << 10;
  static bool Inside(const ir::Region& r, size_t len) {
    return r.key == 1 && len <= r.len && r.addr <= kSize && len <= kSize - r.addr;
  }
  uint8_t mem_[kSize] = {};
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool more() const { return p_ < end_; }
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint32_t pick(uint32_t n) { return u8() % n; }
  uint64_t raw(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{u8()} << (8 * i);
    return v;
  }
  // Small (most), around 4 KiB, around 1 MiB, or near 2^64.
  uint64_t size() {
    switch (u8() & 3) {
      case 0: return u8();
      case 1: return 4096 - 16 + u8() % 32;
      case 2: return (1u << 20) - 64 + u8();
      default: return ~uint64_t{0} - u8();
    }
  }
  uint64_t buffer() { return 1 + u8() % 7; }
  uint64_t stream() { return u8() % 5; }       // 0: the default stream
  uint64_t event() { return 100 + u8() % 7; }
  ir::u64s wait() {
    ir::u64s w;
    for (int n = u8() % 3; n > 0; --n) w.push_back(event());
    return w;
  }
  uint64_t signal() { return (u8() & 1) ? event() : 0; }
  ir::bytes data(size_t cap) {
    ir::bytes b(std::min<size_t>(u8(), cap));
    for (auto& x : b) x = u8();
    return b;
  }
  ir::Region region() {
    if (u8() & 1) return {};
    return ir::Region{raw(2), size(), u8() & 1 ? 1u : 2u};
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// The user events an input created and has not set. A call that may wait for the device
// would wait forever for one that only a later command sets (a real session sets them from
// its receive thread, meanwhile): the targets set them first (SetAll).
class UserEvents {
 public:
  explicit UserEvents(server::Backend& b) : b_(b) {}
  void Created(uint64_t ev) { held_.push_back(ev); }
  void SetAll() {
    for (uint64_t ev : held_) Set(ev);
    held_.clear();
  }
  // An event about to be destroyed unset would leave what waits on it waiting, as natively.
  void SetIfHeld(uint64_t ev) {
    if (std::find(held_.begin(), held_.end(), ev) == held_.end()) return;
    Set(ev);
    std::erase(held_, ev);
  }

 private:
  void Set(uint64_t ev) {
    ir::UserEventSetRep r;
    b_.OnUserEventSet({ev, 0}, &r);
  }
  server::Backend& b_;
  std::vector<uint64_t> held_;
};

// The end of an input: every handle of the pools freed (buffers 1-7, streams 1-4, events
// 100-106), so the next input starts from the same state.
inline void FreePools(server::Backend& b) {
  for (uint64_t h = 1; h <= 7; ++h) {
    ir::BufferFreeRep r;
    b.OnBufferFree({h}, &r);
  }
  for (uint64_t s = 1; s <= 4; ++s) {
    ir::StreamDestroyRep r;
    b.OnStreamDestroy({s}, &r);
  }
  for (uint64_t e = 100; e <= 106; ++e) {
    ir::EventDestroyRep r;
    b.OnEventDestroy({e}, &r);
  }
}

}  // namespace tandem::test
