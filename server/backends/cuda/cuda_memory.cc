// Pointer-stable device memory: the client owns the address space, the server reserves the
// same ranges and maps each allocation at exactly the address the client chose (CUDA VMM:
// cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess). Also the device-to-device
// memory commands and the resolution of (buffer, offset) or absolute addresses.
#include <fmt/format.h>

#include "cuda_backend.h"

namespace tandem::server::cuda {
namespace {

// Rounds up to a multiple of `g`; false when that overflows.
bool RoundUp(uint64_t v, uint64_t g, uint64_t* out) {
  if (v > UINT64_MAX - (g - 1)) return false;
  *out = (v + g - 1) / g * g;
  return true;
}

CUmemAllocationProp DeviceMemory(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

}  // namespace

Status CudaBackend::Granularity(uint32_t device, uint64_t* granularity) {
  Device& d = devices_[device];
  if (!d.granularity) {
    CUmemAllocationProp prop = DeviceMemory(d.dev);
    size_t g = 0;
    TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                 "cuMemGetAllocationGranularity"));
    if (g == 0) return Status(Code::kInternal, "the driver reports an allocation granularity of 0");
    d.granularity = g;
  }
  *granularity = d.granularity;
  return Status::Ok();
}

// Reserves [base, base+size) at exactly `base`; a range the driver places elsewhere (taken by
// host mappings or another reservation) is given back and refused.
Status CudaBackend::Reserve(uint32_t device, uint64_t base, uint64_t size) {
  TANDEM_RETURN_IF_ERROR(Enter(device));
  uint64_t g = 0;
  TANDEM_RETURN_IF_ERROR(Granularity(device, &g));
  CUdeviceptr va = 0;
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemAddressReserve(&va, size, g, base, 0), "cuMemAddressReserve"));
  if (va != base) {
    Forget("cuMemAddressFree", device, drv_->cuMemAddressFree(va, size));
    return Status::Invalid(fmt::format(
        "cannot reserve device address range 0x{:x}-0x{:x} on this server (the driver offered 0x{:x}): it is in use",
        base, base + size, static_cast<uint64_t>(va)));
  }
  reservations_[base] = Reservation{device, size};
  return Status::Ok();
}

Status CudaBackend::OnAddressReserve(const ir::AddressReserveReq& req, ir::AddressReserveRep* rep) {
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  uint64_t g = 0, size = 0;
  TANDEM_RETURN_IF_ERROR(Granularity(device, &g));
  if (req.base == 0 || req.base % g != 0)
    return Status::Invalid(fmt::format("address range base 0x{:x} is not a multiple of the granularity 0x{:x}", req.base, g));
  if (req.size == 0 || !RoundUp(req.size, g, &size) || req.base > UINT64_MAX - size)
    return Status::Invalid(fmt::format("bad address range size 0x{:x} at 0x{:x}", req.size, req.base));
  rep->granularity = g;
  // The same range again (a client that re-reserves after DeviceReset, a replay) is accepted.
  if (auto it = reservations_.find(req.base);
      it != reservations_.end() && it->second.device == device && it->second.size == size)
    return Status::Ok();
  for (const auto& [b, r] : reservations_)
    if (b < req.base + size && req.base < b + r.size)
      return Status::Invalid(fmt::format("address range 0x{:x}-0x{:x} overlaps the reserved range 0x{:x}-0x{:x}",
                                         req.base, req.base + size, b, b + r.size));
  return Reserve(device, req.base, size);
}

Status CudaBackend::OnBufferAlloc(const ir::BufferAllocReq& req, ir::BufferAllocRep*) {
  if (req.buffer == 0) return Status::Invalid("buffer handle 0 is reserved");
  if (buffers_.contains(req.buffer)) return Status::Invalid(fmt::format("buffer {} already exists", req.buffer));
  TANDEM_RETURN_IF_ERROR(CheckDevice(req.device));
  // Access flags describe how kernels use the memory; device memory is read/write either way.
  if (req.flags & ~uint64_t{ir::kBufferReadOnly | ir::kBufferWriteOnly})
    return Status::Invalid(fmt::format("buffer flags 0x{:x} are not supported by the CUDA backend", req.flags));
  if (req.size == 0) return Status::Invalid(fmt::format("buffer {} has size 0", req.buffer));
  if (req.address == 0)
    return Status::Invalid("the CUDA backend maps buffers at client-chosen addresses: BufferAlloc needs an address");
  return MapAllocation(req.buffer, req);
}

Status CudaBackend::MapAllocation(uint64_t buffer, const ir::BufferAllocReq& req) {
  const auto device = static_cast<uint32_t>(req.device);
  TANDEM_RETURN_IF_ERROR(Enter(device));
  uint64_t g = 0, mapped = 0;
  TANDEM_RETURN_IF_ERROR(Granularity(device, &g));
  if (req.address % g != 0 || !RoundUp(req.size, g, &mapped) || req.address > UINT64_MAX - mapped)
    return Status::Invalid(fmt::format("buffer {} at 0x{:x} (size 0x{:x}): the address must be a multiple of 0x{:x}",
                                       buffer, req.address, req.size, g));
  const uint64_t end = req.address + mapped;
  // Inside one reserved range of this device...
  auto res = reservations_.upper_bound(req.address);
  if (res == reservations_.begin() || (--res, end > res->first + res->second.size) || res->second.device != device)
    return Status::Invalid(fmt::format("buffer {} at 0x{:x}-0x{:x} is not inside an address range reserved on device {}",
                                       buffer, req.address, end, device));
  // ...and clear of every live allocation.
  auto next = ranges_.lower_bound(req.address);
  if (next != ranges_.end() && next->first < end)
    return Status::Invalid(fmt::format("buffer {} at 0x{:x}-0x{:x} overlaps the allocation at 0x{:x}", buffer,
                                       req.address, end, next->first));
  if (next != ranges_.begin() && std::prev(next)->second.end > req.address)
    return Status::Invalid(fmt::format("buffer {} at 0x{:x}-0x{:x} overlaps the allocation at 0x{:x}", buffer,
                                       req.address, end, std::prev(next)->first));

  CUmemAllocationProp prop = DeviceMemory(devices_[device].dev);
  CUmemGenericAllocationHandle mem = 0;
  TANDEM_RETURN_IF_ERROR(Check(device, drv_->cuMemCreate(&mem, mapped, &prop, 0), "cuMemCreate"));
  Status st = Check(device, drv_->cuMemMap(req.address, mapped, 0, mem, 0), "cuMemMap");
  if (st.ok()) {
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    st = Check(device, drv_->cuMemSetAccess(req.address, mapped, &access, 1), "cuMemSetAccess");
    if (!st.ok()) Forget("cuMemUnmap", device, drv_->cuMemUnmap(req.address, mapped));
  }
  if (!st.ok()) {
    Forget("cuMemRelease", device, drv_->cuMemRelease(mem));
    return st;
  }
  buffers_[buffer] = Allocation{device, req.address, req.size, mapped, mem};
  ranges_[req.address] = Range{req.address + req.size, device};
  return Status::Ok();
}

Status CudaBackend::FreeAllocation(const Allocation& a) {
  ranges_.erase(a.address);
  Status st = Check(a.device, drv_->cuMemUnmap(a.address, a.mapped), "cuMemUnmap");
  Status released = Check(a.device, drv_->cuMemRelease(a.mem), "cuMemRelease");
  return st.ok() ? released : st;
}

// Like cudaFree, waits for the device first: queued work may still use the memory.
Status CudaBackend::OnBufferFree(const ir::BufferFreeReq& req, ir::BufferFreeRep*) {
  auto it = buffers_.find(req.buffer);
  if (it == buffers_.end()) return Status::Unknown(fmt::format("unknown buffer {}", req.buffer));
  const Allocation a = it->second;
  TANDEM_RETURN_IF_ERROR(Enter(a.device));
  TANDEM_RETURN_IF_ERROR(Check(a.device, drv_->cuCtxSynchronize(), "cuCtxSynchronize"));
  buffers_.erase(it);
  return FreeAllocation(a);
}

// (buffer, offset) or, with buffer 0, an absolute address inside a live allocation or a
// module global; [offset, offset+size) must lie wholly inside it.
Result<CudaBackend::Span> CudaBackend::Resolve(uint64_t buffer, uint64_t offset, uint64_t size,
                                               const char* what) const {
  if (buffer != 0) {
    auto it = buffers_.find(buffer);
    if (it == buffers_.end()) return Status::Unknown(fmt::format("{}: unknown buffer {}", what, buffer));
    const Allocation& a = it->second;
    if (offset > a.size || size > a.size - offset)
      return Status::Invalid(fmt::format("{}: bytes [{}, +{}) are outside buffer {} of {} bytes", what, offset, size,
                                         buffer, a.size));
    return Span{a.device, a.address + offset};
  }
  auto it = ranges_.upper_bound(offset);
  if (it == ranges_.begin() || offset >= std::prev(it)->second.end)
    return Status::Invalid(fmt::format("{}: address 0x{:x} is not inside an allocation or module global of this session",
                                       what, offset));
  --it;
  if (size > it->second.end - offset)
    return Status::Invalid(fmt::format("{}: 0x{:x} + {} bytes runs past the end of its allocation 0x{:x}-0x{:x}", what,
                                       offset, size, it->first, it->second.end));
  return Span{it->second.device, offset};
}

Status CudaBackend::OnBufferCopy(const ir::BufferCopyReq& req, ir::BufferCopyRep*) {
  auto src = Resolve(req.src, req.src_offset, req.size, "BufferCopy source");
  if (!src.ok()) return src.status();
  auto dst = Resolve(req.dst, req.dst_offset, req.size, "BufferCopy destination");
  if (!dst.ok()) return dst.status();
  // Both contexts must exist for a copy between devices; the stream's is entered last.
  TANDEM_RETURN_IF_ERROR(Enter(src->device));
  TANDEM_RETURN_IF_ERROR(Enter(dst->device));
  auto q = ResolveStream(req.stream, dst->device);
  if (!q.ok()) return q.status();
  TANDEM_RETURN_IF_ERROR(WaitEvents(*q, req.wait, req.signal));
  if (req.size > 0) {
    if (src->device == dst->device) {
      TANDEM_RETURN_IF_ERROR(
          Check(q->device, drv_->cuMemcpyDtoDAsync(dst->address, src->address, req.size, q->stream), "cuMemcpyDtoDAsync"));
    } else {
      // Each allocation is mapped for its own device only: the driver stages peer copies.
      TANDEM_RETURN_IF_ERROR(Check(q->device,
                                   drv_->cuMemcpyPeerAsync(dst->address, devices_[dst->device].ctx, src->address,
                                                           devices_[src->device].ctx, req.size, q->stream),
                                   "cuMemcpyPeerAsync"));
    }
  }
  return Signal(*q, req.signal);
}

Status CudaBackend::OnBufferFill(const ir::BufferFillReq& req, ir::BufferFillRep*) {
  const size_t unit = req.pattern.size();
  if (unit != 1 && unit != 2 && unit != 4)
    return Status::Invalid(fmt::format("BufferFill: a pattern of {} bytes (the CUDA backend fills 1, 2 or 4)", unit));
  auto dst = Resolve(req.buffer, req.offset, req.size, "BufferFill");
  if (!dst.ok()) return dst.status();
  if (req.size % unit != 0 || dst->address % unit != 0)
    return Status::Invalid(fmt::format("BufferFill: 0x{:x} + {} bytes is not aligned to its {}-byte pattern",
                                       static_cast<uint64_t>(dst->address), req.size, unit));
  auto q = ResolveStream(req.stream, dst->device);
  if (!q.ok()) return q.status();
  if (q->device != dst->device)
    return Status::Invalid(fmt::format("BufferFill: stream {} is on device {}, the memory on device {}", req.stream,
                                       q->device, dst->device));
  TANDEM_RETURN_IF_ERROR(WaitEvents(*q, req.wait, req.signal));
  uint32_t value = 0;
  for (size_t i = 0; i < unit; ++i) value |= static_cast<uint32_t>(req.pattern[i]) << (8 * i);
  const size_t n = req.size / unit;
  if (n > 0) {
    CUresult r = unit == 1   ? drv_->cuMemsetD8Async(dst->address, static_cast<uint8_t>(value), n, q->stream)
                 : unit == 2 ? drv_->cuMemsetD16Async(dst->address, static_cast<uint16_t>(value), n, q->stream)
                             : drv_->cuMemsetD32Async(dst->address, value, n, q->stream);
    TANDEM_RETURN_IF_ERROR(Check(q->device, r, "cuMemsetAsync"));
  }
  return Signal(*q, req.signal);
}

// A rectangular device-to-device copy: origins and region are {bytes, rows, slices}, pitches
// {src row, src slice, dst row, dst slice} (0: tightly packed). With buffer 0 the origin's
// first coordinate holds the absolute address.
Status CudaBackend::OnBufferCopyRect(const ir::BufferCopyRectReq& req, ir::BufferCopyRectRep*) {
  if (req.src_origin.size() != 3 || req.dst_origin.size() != 3 || req.region.size() != 3 || req.pitches.size() != 4)
    return Status::Invalid("BufferCopyRect needs 3 origin, 3 region and 4 pitch values");
  const auto& r = req.region;
  struct Side {
    uint64_t row, slice;
    Span span;  // the first byte of the copied extent
  };
  auto side = [&](uint64_t buffer, const ir::u64s& o, uint64_t row, uint64_t slice, const char* what) -> Result<Side> {
    if (row == 0) row = r[0];
    if (r[1] > UINT64_MAX / row)
      return Status::Invalid(fmt::format("BufferCopyRect {}: row pitch {} overflows over {} rows", what, row, r[1]));
    if (slice == 0) slice = row * r[1];
    if (row < r[0] || (r[2] > 1 && slice < row * r[1]))
      return Status::Invalid(fmt::format("BufferCopyRect {}: pitches {}/{} are smaller than the region", what, row, slice));
    // first = o2*slice + o1*row + o0; the extent runs (r2-1)*slice + (r1-1)*row + r0 bytes on.
    // Each product fits 128 bits; checked against 64 before they are added, their sums do too.
    using Wide = unsigned __int128;
    const Wide terms[] = {Wide{o[2]} * slice, Wide{o[1]} * row, Wide{r[2] - 1} * slice, Wide{r[1] - 1} * row};
    for (Wide t : terms)
      if (t > UINT64_MAX)
        return Status::Invalid(fmt::format("BufferCopyRect {}: the region runs past the address space", what));
    const Wide first = terms[0] + terms[1] + o[0];
    const Wide extent = terms[2] + terms[3] + r[0];
    if (first + extent > UINT64_MAX)
      return Status::Invalid(fmt::format("BufferCopyRect {}: the region runs past the address space", what));
    auto s = Resolve(buffer, static_cast<uint64_t>(first), static_cast<uint64_t>(extent), what);
    if (!s.ok()) return s.status();
    return Side{row, slice, *s};
  };
  if (r[0] == 0 || r[1] == 0 || r[2] == 0) {
    // Nothing to copy: the command still orders its stream and signals its event.
    auto dst = Resolve(req.dst, req.dst_origin[0], 0, "BufferCopyRect destination");
    if (!dst.ok()) return dst.status();
    auto q = ResolveStream(req.stream, dst->device);
    if (!q.ok()) return q.status();
    TANDEM_RETURN_IF_ERROR(WaitEvents(*q, req.wait, req.signal));
    return Signal(*q, req.signal);
  }
  auto src = side(req.src, req.src_origin, req.pitches[0], req.pitches[1], "source");
  if (!src.ok()) return src.status();
  auto dst = side(req.dst, req.dst_origin, req.pitches[2], req.pitches[3], "destination");
  if (!dst.ok()) return dst.status();
  TANDEM_RETURN_IF_ERROR(Enter(src->span.device));
  TANDEM_RETURN_IF_ERROR(Enter(dst->span.device));
  auto q = ResolveStream(req.stream, dst->span.device);
  if (!q.ok()) return q.status();
  TANDEM_RETURN_IF_ERROR(WaitEvents(*q, req.wait, req.signal));

  // One 3D copy when both slice pitches are whole rows, else one per slice.
  const bool whole = src->slice % src->row == 0 && dst->slice % dst->row == 0;
  const uint64_t copies = whole ? 1 : r[2];
  for (uint64_t z = 0; z < copies; ++z) {
    CUDA_MEMCPY3D_PEER c{};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src->span.address + z * src->slice;
    c.srcContext = devices_[src->span.device].ctx;
    c.srcPitch = src->row;
    c.srcHeight = whole ? src->slice / src->row : r[1];
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst->span.address + z * dst->slice;
    c.dstContext = devices_[dst->span.device].ctx;
    c.dstPitch = dst->row;
    c.dstHeight = whole ? dst->slice / dst->row : r[1];
    c.WidthInBytes = r[0];
    c.Height = r[1];
    c.Depth = whole ? r[2] : 1;
    TANDEM_RETURN_IF_ERROR(Check(q->device, drv_->cuMemcpy3DPeerAsync(&c, q->stream), "cuMemcpy3DPeerAsync"));
  }
  return Signal(*q, req.signal);
}

}  // namespace tandem::server::cuda
