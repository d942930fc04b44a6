// Copies and fills by kind: every device pointer is an absolute address (IR buffer 0), so a
// copy needs no lookup on the server. The client checks each range against its own
// allocations first, as CUDA does, and tells host from device by address for
// cudaMemcpyDefault. Pinned host memory travels by RMA with its cached registration.
#include <algorithm>
#include <cstring>
#include <functional>

#include "frontend.h"
#include "tandem/client/completion.h"

namespace tandem::cuda {
namespace {

// Everything a transfer needs once the front end's lock is released.
struct Target {
  client::Session* session = nullptr;
  DeviceContext* device = nullptr;
  uint64_t stream = 0;
};

// The registration of pinned memory with a session, made on first use and kept.
std::shared_ptr<fabric::MemoryRegion> Registration(const void* p, size_t n, client::Session& s) {
  Frontend& f = Frontend::Get();
  auto* r = const_cast<HostRegion*>(f.FindHost(p, n));
  if (!r || !s.rma() || n <= ir::kInlineDataLimit) return nullptr;
  auto& mr = r->mr[&s];
  if (!mr) {
    auto reg = s.Register(r->base, r->size, fabric::kRemoteRead | fabric::kRemoteWrite);
    if (!reg.ok()) {
      log::Warn("cannot register pinned memory ({} bytes): {}; copies go unpinned", r->size, reg.status().message());
      return nullptr;
    }
    mr = std::move(reg).value();
  }
  return mr;
}

ir::Region RegionOf(const fabric::MemoryRegion& mr, const void* p, size_t n) {
  const uint64_t offset = static_cast<uint64_t>(static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(mr.base()));
  return ir::Region{.addr = mr.remote_addr() + offset, .len = n, .key = mr.key()};
}

using Done = tandem::client::Completion;

// How a transfer's end is told: a synchronous one's waiter, or an asynchronous one's ticket.
std::function<void(const Status&)> Finish(std::shared_ptr<Done> done, uint64_t ticket) {
  return [done = std::move(done), ticket](const Status& st) {
    if (done) done->Set(st);
    else Frontend::Get().EndPending(ticket, st);
  };
}

// What the caller gets: an asynchronous transfer's posting, a synchronous one's whole result.
cudaError_t Outcome(const std::shared_ptr<Done>& done, const Status& posted) {
  if (!done) return ToCuda(posted);
  Status st = done->Wait();
  return ToCuda(st.ok() ? posted : st);
}

// Host -> device. Synchronous copies return once the source may be reused; asynchronous ones
// from pageable memory are staged first; from pinned memory they read it in place, later.
// Posted under post_order (frontend.h); a synchronous one is waited for after.
cudaError_t Write(const Target& t, uint64_t address, const void* src, size_t n, bool async,
                  std::shared_ptr<fabric::MemoryRegion> pinned) {
  Frontend& f = Frontend::Get();
  ir::BufferWriteReq req{.stream = t.stream, .buffer = 0, .offset = address, .size = n};
  auto done = async ? nullptr : std::make_shared<Done>();
  Status posted;
  {
    std::lock_guard<std::mutex> order(f.post_order);
    if (n > ir::kInlineDataLimit) f.WaitCallbacks();  // the server waits on its stream for bulk writes
    auto finish = Finish(done, async ? f.BeginPending(t.stream) : 0);
    if (pinned) {
      req.remote = RegionOf(*pinned, src, n);
      t.session->Post(req, [pinned, finish](const Status& st, ir::BufferWriteRep&&) { finish(st); });
      posted = t.session->Flush();
    } else if (async) {
      auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                           static_cast<const uint8_t*>(src) + n);
      posted = client::WriteBuffer(*t.session, req, staged->data(), false,
                                   [staged, finish](const Status& st) { finish(st); });
    } else {
      posted = client::WriteBuffer(*t.session, req, src, false, finish);
    }
  }
  return Outcome(done, posted);
}

// Device -> host. Asynchronous reads land before the next sync point returns. `pinned`: the
// destination's RMA registration, if the copy goes that way (null for small copies).
cudaError_t Read(const Target& t, uint64_t address, void* dst, size_t n, bool async,
                 std::shared_ptr<fabric::MemoryRegion> pinned) {
  Frontend& f = Frontend::Get();
  ir::BufferReadReq req{.stream = t.stream, .buffer = 0, .offset = address, .size = n};
  auto done = async ? nullptr : std::make_shared<Done>();
  Status posted;
  {
    std::unique_lock<std::mutex> order = f.AfterCallbacks();  // the server waits for the stream to read
    auto finish = Finish(done, async ? f.BeginPending(t.stream) : 0);
    if (pinned) {
      req.remote = RegionOf(*pinned, dst, n);
      t.session->Post(req, [pinned, finish](const Status& st, ir::BufferReadRep&&) { finish(st); });
      posted = t.session->Flush();
    } else {
      posted = client::ReadBuffer(*t.session, req, dst, false, finish);
    }
  }
  return Outcome(done, posted);
}

struct Side {
  bool device = false;
  DevicePtr ptr;
};

// Which side a pointer is on for a copy of `kind`: explicit kinds must match the pointer.
cudaError_t Classify(const void* p, size_t n, bool want_device, bool by_address, Side* out) {
  std::optional<DevicePtr> dp = FindDevicePtr(p);
  out->device = by_address ? dp.has_value() : want_device;
  if (!out->device) return dp && !by_address ? cudaErrorInvalidValue : cudaSuccess;
  if (!dp || dp->room < n) return cudaErrorInvalidValue;
  out->ptr = *dp;
  return cudaSuccess;
}

cudaError_t Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  const bool by_address = kind == cudaMemcpyDefault;
  Side d, s;
  TANDEM_RETURN_CUDA_IF_ERROR(Classify(dst, n, kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice,
                                       by_address, &d));
  TANDEM_RETURN_CUDA_IF_ERROR(Classify(src, n, kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice,
                                       by_address, &s));
  if (!d.device && !s.device) {
    lock.unlock();
    std::memmove(dst, src, n);
    return cudaSuccess;
  }
  StreamRef sr;
  TANDEM_RETURN_CUDA_IF_ERROR(ResolveStream(stream, &sr));
  DeviceContext* dev = d.device ? d.ptr.device : s.ptr.device;
  if (dev->sticky != cudaSuccess) return dev->sticky;
  // A stream of another device cannot order this copy; its device's default stream does.
  Target t{.session = &dev->session(), .device = dev, .stream = sr.device == dev->index ? sr.handle : 0};
  if (d.device && s.device) {
    if (d.ptr.device == s.ptr.device) {
      t.session->Post(ir::BufferCopyReq{.stream = t.stream, .src = 0, .src_offset = s.ptr.address, .dst = 0,
                                        .dst_offset = d.ptr.address, .size = n});
      return cudaSuccess;
    }
    DeviceContext* sdev = s.ptr.device;
    if (sdev->sticky != cudaSuccess) return sdev->sticky;
    const uint64_t src_stream = sr.device == sdev->index ? sr.handle : 0;
    if (&sdev->session() != t.session) {
      // Between servers: the destination server pulls the bytes from the source server
      // (relayed through this process with TANDEM_VDMA=0). Like a native device-to-device
      // copy, it does not wait for the copy to finish.
      client::CopyEnd from{.session = &sdev->session(), .stream = src_stream, .buffer = 0, .offset = s.ptr.address,
                           .wait = dev->ForeignWaits(t.stream, &sdev->session())};
      client::CopyEnd to{.session = t.session, .stream = t.stream, .buffer = 0, .offset = d.ptr.address};
      lock.unlock();
      // The source server reads its stream (a large copy waits for it there; a relay reads
      // back synchronously): not behind a host callback's gate.
      std::unique_lock<std::mutex> order = f.AfterCallbacks();
      return ToCuda(client::CopyBetweenServers(from, to, n, 0));
    }
    // Two devices of one server: staged through the client.
    Target from{.session = &sdev->session(), .device = sdev, .stream = src_stream};
    lock.unlock();
    std::vector<uint8_t> staging(n);
    TANDEM_RETURN_CUDA_IF_ERROR(Read(from, s.ptr.address, staging.data(), n, false, nullptr));
    return Write(t, d.ptr.address, staging.data(), n, false, nullptr);
  }
  if (d.device) {
    auto pinned = Registration(src, n, *t.session);
    lock.unlock();
    return Write(t, d.ptr.address, src, n, async, std::move(pinned));
  }
  auto pinned = Registration(dst, n, *t.session);
  // Into pageable memory an asynchronous read returns once the bytes are there, as CUDA's does
  // ("for transfers from device memory to pageable host memory, the function will return only
  // once the copy has completed"): the program may read them at once. Into pinned memory it
  // stays asynchronous.
  const bool to_pageable = f.FindHost(dst, n) == nullptr;
  lock.unlock();
  TANDEM_RETURN_CUDA_IF_ERROR(Read(t, s.ptr.address, dst, n, async && !to_pageable, std::move(pinned)));
  // A synchronous read back is a sync point: earlier kernels' failures surface here.
  return async ? cudaSuccess : TakeAsyncErrors(*dev);
}

// Row by row, except device-to-device copies (one rectangular copy on the server).
cudaError_t Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                   cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (width == 0 || height == 0) return cudaSuccess;
  // The spans below, and every row's offset, must be representable.
  size_t span;
  if (__builtin_mul_overflow(std::max(dpitch, spitch), height - 1, &span) || __builtin_add_overflow(span, width, &span))
    return cudaErrorInvalidValue;
  if (dpitch == width && spitch == width) return Copy(dst, src, width * height, kind, stream, async);
  Frontend& f = Frontend::Get();
  {
    std::lock_guard<std::mutex> lock(f.mu);
    std::optional<DevicePtr> d = FindDevicePtr(dst), s = FindDevicePtr(src);
    const size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    const bool d2d = kind == cudaMemcpyDeviceToDevice || (kind == cudaMemcpyDefault && d && s);
    if (d2d && d && s && d->device == s->device && d->room >= dspan && s->room >= sspan) {
      StreamRef sr;
      TANDEM_RETURN_CUDA_IF_ERROR(ResolveStream(stream, &sr));
      d->device->session().Post(ir::BufferCopyRectReq{
          .stream = sr.device == d->device->index ? sr.handle : 0,
          .src = 0,
          .dst = 0,
          .src_origin = {s->address, 0, 0},
          .dst_origin = {d->address, 0, 0},
          .region = {width, height, 1},
          .pitches = {spitch, spitch * height, dpitch, dpitch * height}});
      return cudaSuccess;
    }
  }
  for (size_t row = 0; row < height; ++row) {
    TANDEM_RETURN_CUDA_IF_ERROR(Copy(static_cast<uint8_t*>(dst) + row * dpitch,
                                     static_cast<const uint8_t*>(src) + row * spitch, width, kind, stream, true));
  }
  if (async) return cudaSuccess;
  return f.WaitPending();
}

// The address of (x bytes, row y, slice z) of a pitched pointer; false if it overflows.
bool PitchedAt(const cudaPitchedPtr& p, const cudaPos& pos, size_t z, uintptr_t* out) {
  size_t slice, row, at;
  if (__builtin_add_overflow(pos.z, z, &slice) || __builtin_mul_overflow(slice, p.ysize, &row) ||
      __builtin_add_overflow(row, pos.y, &row) || __builtin_mul_overflow(row, p.pitch, &at) ||
      __builtin_add_overflow(at, pos.x, &at) || __builtin_add_overflow(reinterpret_cast<uintptr_t>(p.ptr), at, out))
    return false;
  return true;
}

// 3-D copies between pitched pointers, one 2-D copy per slice (the CUDA array forms are not
// supported). A slice is `ysize` rows of `pitch` bytes.
cudaError_t Copy3D(const cudaMemcpy3DParms* p, cudaStream_t stream, bool async) {
  if (!p) return cudaErrorInvalidValue;
  if (p->srcArray || p->dstArray) return Unsupported("cudaMemcpy3D with a CUDA array");
  const cudaExtent& e = p->extent;
  if (e.width == 0 || e.height == 0 || e.depth == 0) return cudaSuccess;
  if (!p->srcPtr.ptr || !p->dstPtr.ptr) return cudaErrorInvalidValue;
  for (size_t z = 0; z < e.depth; ++z) {
    uintptr_t src = 0, dst = 0;
    if (!PitchedAt(p->srcPtr, p->srcPos, z, &src) || !PitchedAt(p->dstPtr, p->dstPos, z, &dst))
      return cudaErrorInvalidValue;
    TANDEM_RETURN_CUDA_IF_ERROR(Copy2D(reinterpret_cast<void*>(dst), p->dstPtr.pitch, reinterpret_cast<const void*>(src),
                                       p->srcPtr.pitch, e.width, e.height, p->kind, stream, true));
  }
  if (async) return cudaSuccess;
  return Frontend::Get().WaitPending();
}

cudaError_t Fill(void* ptr, int value, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::optional<DevicePtr> dp = FindDevicePtr(ptr);
  if (!dp || dp->room < n) return cudaErrorInvalidValue;
  StreamRef sr;
  TANDEM_RETURN_CUDA_IF_ERROR(ResolveStream(stream, &sr));
  if (dp->device->sticky != cudaSuccess) return dp->device->sticky;
  dp->device->session().Post(ir::BufferFillReq{.stream = sr.device == dp->device->index ? sr.handle : 0,
                                               .buffer = 0,
                                               .offset = dp->address,
                                               .size = n,
                                               .pattern = {static_cast<uint8_t>(value)}});
  return cudaSuccess;
}

// The device address of `symbol` + offset on the current device, checked against its size.
cudaError_t SymbolAddress(const void* symbol, size_t count, size_t offset, void** out) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.symbols.find(symbol);
  if (it == f.symbols.end()) return cudaErrorInvalidSymbol;
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(f.Current(&d));
  uint64_t address = 0, size = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(EnsureSymbol(*d, *it->second, &address, &size));
  if (offset > size || count > size - offset) return cudaErrorInvalidValue;
  *out = reinterpret_cast<void*>(address + offset);
  return cudaSuccess;
}

}  // namespace
}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

TANDEM_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return Return(Copy(dst, src, n, kind, nullptr, false));
}

TANDEM_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  if (auto c = Captured(stream, "memcpy", [=](cudaStream_t s) { return cudaMemcpyAsync(dst, src, n, kind, s); })) return Return(*c);
  return Return(Copy(dst, src, n, kind, stream, true));
}

TANDEM_API cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                    size_t height, cudaMemcpyKind kind) {
  return Return(Copy2D(dst, dpitch, src, spitch, width, height, kind, nullptr, false));
}

TANDEM_API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                         size_t height, cudaMemcpyKind kind, cudaStream_t stream) {
  if (auto c = Captured(stream, "memcpy", [=](cudaStream_t s) {
        return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s);
      }))
    return Return(*c);
  return Return(Copy2D(dst, dpitch, src, spitch, width, height, kind, stream, true));
}

// Peer copies: pointers already say which device they are on (one address space); the
// device arguments must agree with them.
cudaError_t PeerCopy(void* dst, int dst_device, const void* src, int src_device, size_t n, cudaStream_t stream,
                     bool async) {
  {
    Frontend& f = Frontend::Get();
    std::lock_guard<std::mutex> lock(f.mu);
    std::vector<DeviceContext*>* list = nullptr;
    TANDEM_RETURN_CUDA_IF_ERROR(f.Devices(&list));
    const auto count = static_cast<int>(list->size());
    if (dst_device < 0 || dst_device >= count || src_device < 0 || src_device >= count) return cudaErrorInvalidDevice;
    if (n == 0) return cudaSuccess;
    std::optional<DevicePtr> d = FindDevicePtr(dst), s = FindDevicePtr(src);
    if (!d || !s || d->device != (*list)[dst_device] || s->device != (*list)[src_device]) return cudaErrorInvalidValue;
  }
  return Copy(dst, src, n, cudaMemcpyDeviceToDevice, stream, async);
}

TANDEM_API cudaError_t cudaMemcpyPeer(void* dst, int dst_device, const void* src, int src_device, size_t n) {
  return Return(PeerCopy(dst, dst_device, src, src_device, n, nullptr, false));
}

TANDEM_API cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t n,
                                           cudaStream_t stream) {
  if (auto c = Captured(stream, "memcpy", [=](cudaStream_t s) {
        return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, s);
      }))
    return Return(*c);
  return Return(PeerCopy(dst, dst_device, src, src_device, n, stream, true));
}

TANDEM_API cudaError_t cudaMemset(void* ptr, int value, size_t n) { return Return(Fill(ptr, value, n, nullptr)); }

TANDEM_API cudaError_t cudaMemsetAsync(void* ptr, int value, size_t n, cudaStream_t stream) {
  if (auto c = Captured(stream, "memset", [=](cudaStream_t s) { return cudaMemsetAsync(ptr, value, n, s); })) return Return(*c);
  return Return(Fill(ptr, value, n, stream));
}

TANDEM_API cudaError_t cudaMemset2D(void* ptr, size_t pitch, int value, size_t width, size_t height) {
  return cudaMemset2DAsync(ptr, pitch, value, width, height, nullptr);
}

// One fill per row, posted together (asynchronous like every fill).
TANDEM_API cudaError_t cudaMemset2DAsync(void* ptr, size_t pitch, int value, size_t width, size_t height,
                                         cudaStream_t stream) {
  if (width > pitch) return Return(cudaErrorInvalidValue);
  if (auto c = Captured(stream, "memset", [=](cudaStream_t s) {
        return cudaMemset2DAsync(ptr, pitch, value, width, height, s);
      }))
    return Return(*c);
  for (size_t row = 0; row < height; ++row)
    TANDEM_RETURN_CUDA_IF_ERROR(Return(Fill(static_cast<uint8_t*>(ptr) + row * pitch, value, width, stream)));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemcpy3D(const cudaMemcpy3DParms* p) { return Return(Copy3D(p, nullptr, false)); }

TANDEM_API cudaError_t cudaMemcpy3DAsync(const cudaMemcpy3DParms* p, cudaStream_t stream) {
  if (p) {
    if (auto c = Captured(stream, "memcpy", [parms = *p](cudaStream_t s) { return cudaMemcpy3DAsync(&parms, s); }))
      return Return(*c);
  }
  return Return(Copy3D(p, stream, true));
}

TANDEM_API cudaError_t cudaMemset3D(cudaPitchedPtr ptr, int value, cudaExtent extent) {
  return cudaMemset3DAsync(ptr, value, extent, nullptr);
}

// One 2-D fill per slice.
TANDEM_API cudaError_t cudaMemset3DAsync(cudaPitchedPtr ptr, int value, cudaExtent extent, cudaStream_t stream) {
  if (auto c = Captured(stream, "memset", [=](cudaStream_t s) { return cudaMemset3DAsync(ptr, value, extent, s); }))
    return Return(*c);
  if (extent.width == 0 || extent.height == 0 || extent.depth == 0) return cudaSuccess;
  for (size_t z = 0; z < extent.depth; ++z) {
    uintptr_t at = 0;
    if (!PitchedAt(ptr, cudaPos{0, 0, 0}, z, &at)) return Return(cudaErrorInvalidValue);
    TANDEM_RETURN_CUDA_IF_ERROR(
        cudaMemset2DAsync(reinterpret_cast<void*>(at), ptr.pitch, value, extent.width, extent.height, stream));
  }
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemcpyToSymbol(const void* symbol, const void* src, size_t count, size_t offset,
                                          cudaMemcpyKind kind) {
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return Return(cudaErrorInvalidMemcpyDirection);
  void* dst = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(SymbolAddress(symbol, count, offset, &dst)));
  return Return(Copy(dst, src, count, kind, nullptr, false));
}

TANDEM_API cudaError_t cudaMemcpyFromSymbol(void* dst, const void* symbol, size_t count, size_t offset,
                                            cudaMemcpyKind kind) {
  if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return Return(cudaErrorInvalidMemcpyDirection);
  void* src = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(SymbolAddress(symbol, count, offset, &src)));
  return Return(Copy(dst, src, count, kind, nullptr, false));
}

TANDEM_API cudaError_t cudaMemcpyToSymbolAsync(const void* symbol, const void* src, size_t count, size_t offset,
                                               cudaMemcpyKind kind, cudaStream_t stream) {
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return Return(cudaErrorInvalidMemcpyDirection);
  void* dst = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(SymbolAddress(symbol, count, offset, &dst)));
  // Captured with the symbol's address on the device current now.
  if (auto c = Captured(stream, "memcpy", [=](cudaStream_t s) { return cudaMemcpyAsync(dst, src, count, kind, s); }))
    return Return(*c);
  return Return(Copy(dst, src, count, kind, stream, true));
}

TANDEM_API cudaError_t cudaMemcpyFromSymbolAsync(void* dst, const void* symbol, size_t count, size_t offset,
                                                 cudaMemcpyKind kind, cudaStream_t stream) {
  if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
    return Return(cudaErrorInvalidMemcpyDirection);
  void* src = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(SymbolAddress(symbol, count, offset, &src)));
  if (auto c = Captured(stream, "memcpy", [=](cudaStream_t s) { return cudaMemcpyAsync(dst, src, count, kind, s); }))
    return Return(*c);
  return Return(Copy(dst, src, count, kind, stream, true));
}

TANDEM_API cudaError_t cudaGetSymbolAddress(void** dev_ptr, const void* symbol) {
  if (!dev_ptr) return Return(cudaErrorInvalidValue);
  return Return(SymbolAddress(symbol, 0, 0, dev_ptr));
}

TANDEM_API cudaError_t cudaGetSymbolSize(size_t* size, const void* symbol) {
  if (!size) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.symbols.find(symbol);
  if (it == f.symbols.end()) return Return(cudaErrorInvalidSymbol);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  uint64_t address = 0, bytes = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(EnsureSymbol(*d, *it->second, &address, &bytes)));
  *size = bytes;
  return cudaSuccess;
}
