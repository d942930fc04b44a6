// Device memory at addresses the client chooses (no round trip for cudaMalloc), pinned and
// registered host memory, and pointer queries. Copies are in memcpy.cc.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "frontend.h"

namespace tandem::cuda {
namespace {

constexpr uint64_t kChunkSize = 2u << 20;   // small allocations share chunks of at least this
constexpr uint64_t kSmallLimit = 1u << 20;  // allocations up to this size are carved from chunks
constexpr uint64_t kSmallAlign = 256;       // cudaMalloc's alignment guarantee

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A new remote allocation at an address of the device's range: BufferAlloc is asynchronous.
cudaError_t NewBuffer(DeviceContext& d, uint64_t size, bool chunk, uint64_t* address) {
  uint64_t total = 0;
  if (d.dev->PropAs<uint64_t>(ir::kCudaTotalMem, &total) && d.allocated + size > total) return cudaErrorMemoryAllocation;
  std::optional<uint64_t> a = d.va->Allocate(size, d.granularity);
  if (!a) return cudaErrorMemoryAllocation;
  Allocation alloc{.handle = client::Runtime::Get().NewHandle(), .size = size, .chunk = chunk};
  if (chunk) alloc.carve = std::make_unique<RangeAllocator>(*a, size);
  d.session().Post(ir::BufferAllocReq{.buffer = alloc.handle, .device = d.remote(), .size = size, .address = *a});
  d.allocations.emplace(*a, std::move(alloc));
  d.allocated += size;
  *address = *a;
  return cudaSuccess;
}

cudaError_t Allocate(DeviceContext& d, uint64_t size, uint64_t* address) {
  if (size > kSmallLimit) return NewBuffer(d, RoundUp(size, d.granularity), false, address);
  const uint64_t rounded = RoundUp(size, kSmallAlign);
  for (auto& [base, alloc] : d.allocations) {
    if (!alloc.chunk) continue;
    if (std::optional<uint64_t> a = alloc.carve->Allocate(rounded, kSmallAlign)) {
      d.small.emplace(*a, std::make_pair(base, rounded));
      *address = *a;
      return cudaSuccess;
    }
  }
  uint64_t chunk = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(NewBuffer(d, RoundUp(kChunkSize, d.granularity), true, &chunk));
  *address = *d.allocations.at(chunk).carve->Allocate(rounded, kSmallAlign);
  d.small.emplace(*address, std::make_pair(chunk, rounded));
  return cudaSuccess;
}

DeviceContext* OwnerOf(uint64_t address) {
  for (DeviceContext* d : Frontend::Get().known())
    if (d->ready && address >= d->va_base && address - d->va_base < d->va_size) return d;
  return nullptr;
}

// Gives an allocation's addresses back: small ones to their chunk (kept for reuse), large ones
// unmapped on the server, whose free waits for the device (so not behind a host callback's
// gate: AfterCallbacks). The caller knows no work still uses it. Needs mu.
cudaError_t FreeNow(DeviceContext& d, uint64_t a) {
  Frontend& f = Frontend::Get();
  if (auto p = f.pooled.find(a); p != f.pooled.end()) Unpool(p);  // a stream-ordered allocation
  if (auto s = d.small.find(a); s != d.small.end()) {
    d.allocations.at(s->second.first).carve->Free(a, s->second.second);
    d.small.erase(s);
    return cudaSuccess;
  }
  auto it = d.allocations.find(a);
  if (it == d.allocations.end() || it->second.chunk) return cudaErrorInvalidValue;
  {
    std::unique_lock<std::mutex> order = f.AfterCallbacks();
    d.session().Post(ir::BufferFreeReq{.buffer = it->second.handle});
  }
  d.va->Free(a, it->second.size);
  d.allocated -= it->second.size;
  d.allocations.erase(it);
  return cudaSuccess;
}

bool IsAllocation(const DeviceContext& d, uint64_t a) {
  if (d.small.contains(a)) return true;
  auto it = d.allocations.find(a);
  return it != d.allocations.end() && !it->second.chunk;
}

bool FreedAsync(uint64_t a) {
  const auto& freed = Frontend::Get().freed_async;
  return std::any_of(freed.begin(), freed.end(), [&](const Frontend::FreedAsync& x) { return x.address == a; });
}

// The size an allocation of `size` bytes takes (as Allocate rounds it), and the size of the
// allocation at `a`.
uint64_t Footprint(const DeviceContext& d, uint64_t size) {
  return size > kSmallLimit ? RoundUp(size, d.granularity) : RoundUp(size, kSmallAlign);
}
uint64_t AllocationSize(const DeviceContext& d, uint64_t a) {
  if (auto s = d.small.find(a); s != d.small.end()) return s->second.second;
  auto it = d.allocations.find(a);
  return it == d.allocations.end() ? 0 : it->second.size;
}

// cudaMalloc and cudaMallocAsync on `d`, with `lock` held on Frontend::mu. When the device's
// memory runs out while cudaFreeAsync holds some of it back, the devices whose streams those
// frees were made on are synchronized (the lock released meanwhile), which releases them,
// before one more try.
cudaError_t AllocateOrSync(std::unique_lock<std::mutex>& lock, DeviceContext& d, size_t size, uint64_t* address) {
  if (size > d.va_size) return cudaErrorMemoryAllocation;  // more than the device's range
  cudaError_t e = Allocate(d, size, address);
  if (e != cudaErrorMemoryAllocation) return e;
  Frontend& f = Frontend::Get();
  std::set<int> stream_devices;
  for (const Frontend::FreedAsync& x : f.freed_async)
    if (x.stream_device == d.index || OwnerOf(x.address) == &d) stream_devices.insert(x.stream_device);
  if (stream_devices.empty()) return e;
  std::vector<DeviceContext*> sync;
  for (int i : stream_devices)
    if (DeviceContext* sd = f.Existing(i)) sync.push_back(sd);
  lock.unlock();
  // Each device's asynchronous errors stay for its own next synchronize: only the frees matter.
  for (DeviceContext* sd : sync) {
    uint64_t freed = 0;
    {
      std::lock_guard<std::mutex> l(f.mu);
      freed = f.freed_async_count;
    }
    if (!f.CallAfterCallbacks(sd->session(), ir::DeviceSyncReq{.device = sd->remote()}).ok()) continue;
    std::lock_guard<std::mutex> l(f.mu);
    ReleaseFreedAsync(sd->index, std::nullopt, freed);
  }
  lock.lock();
  if (d.sticky != cudaSuccess) return d.sticky;
  return Allocate(d, size, address);
}

}  // namespace

void ReleaseFreedAsync(int stream_device, std::optional<uint64_t> stream, uint64_t up_to) {
  Frontend& f = Frontend::Get();
  std::erase_if(f.freed_async, [&](const Frontend::FreedAsync& x) {
    if (x.stream_device != stream_device || (stream && *stream != x.stream) || x.order > up_to) return false;
    // The owner may have been reset meanwhile (cudaDeviceReset forgets its allocations).
    if (DeviceContext* owner = OwnerOf(x.address); owner && IsAllocation(*owner, x.address)) FreeNow(*owner, x.address);
    return true;
  });
}

// Stream-ordered allocation. The memory is allocated as cudaMalloc's, except that a block of
// the same size and pool that cudaFreeAsync gave back on this same stream is handed out again
// as it is: this stream's later work runs after that free, and no other stream or allocation
// ever gets it before the stream is known past it (the pool's reuse attributes allow no less).
cudaError_t StreamOrderedAlloc(std::unique_lock<std::mutex>& lock, MemPool& pool, DeviceContext& sd,
                               const StreamRef& s, size_t size, void** ptr) {
  Frontend& f = Frontend::Get();
  DeviceContext* d = nullptr;  // where the pool's memory is
  TANDEM_RETURN_CUDA_IF_ERROR(f.Device(pool.device, &d));
  if (d->sticky != cudaSuccess) return d->sticky;
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  const uint64_t footprint = Footprint(*d, size);
  for (auto it = f.freed_async.rbegin(); it != f.freed_async.rend(); ++it) {
    if (it->stream_device != sd.index || it->stream != s.handle || OwnerOf(it->address) != d ||
        AllocationSize(*d, it->address) != footprint)
      continue;
    auto p = f.pooled.find(it->address);
    if (p == f.pooled.end() ? !pool.is_default : p->second.pool != &pool) continue;
    if (p == f.pooled.end()) {  // cudaMalloc's memory freed in stream order: the default pool's now
      p = f.pooled.emplace(it->address, Frontend::Pooled{.pool = &pool, .footprint = footprint, .freed = true}).first;
      pool.Reserve(footprint);
    }
    p->second.freed = false;
    pool.Use(footprint);
    *ptr = reinterpret_cast<void*>(it->address);
    f.freed_async.erase(std::next(it).base());
    return cudaSuccess;
  }
  // A capped pool: what it holds back counts until released, as natively (a synchronize
  // first, as when the device's memory runs out, would let a release in).
  if (pool.cap && pool.reserved + footprint > pool.cap) return cudaErrorMemoryAllocation;
  uint64_t address = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(AllocateOrSync(lock, *d, size, &address));
  f.pooled[address] = Frontend::Pooled{.pool = &pool, .footprint = footprint, .freed = false};
  pool.Use(footprint);
  pool.Reserve(footprint);
  *ptr = reinterpret_cast<void*>(address);
  return cudaSuccess;
}

std::optional<DevicePtr> FindDevicePtr(const void* p) {
  const auto a = reinterpret_cast<uint64_t>(p);
  if (DeviceContext* d = OwnerOf(a)) {
    DevicePtr out{.device = d, .address = a, .room = 0};  // room 0: inside the range, not allocated
    if (auto it = d->small.upper_bound(a); it != d->small.begin()) {
      --it;
      if (a - it->first < it->second.second) out.room = it->first + it->second.second - a;
    }
    if (auto it = d->allocations.upper_bound(a); out.room == 0 && it != d->allocations.begin()) {
      --it;
      if (!it->second.chunk && a - it->first < it->second.size) out.room = it->first + it->second.size - a;
    }
    return out;
  }
  // Module globals live where the server's driver put them.
  for (DeviceContext* d : Frontend::Get().known())
    for (const auto& [sym, g] : d->globals)
      if (a >= g.first && a - g.first < g.second) return DevicePtr{.device = d, .address = a, .room = g.first + g.second - a};
  return std::nullopt;
}

const HostRegion* Frontend::FindHost(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = host_regions.upper_bound(a);
  if (it == host_regions.begin()) return nullptr;
  --it;
  const HostRegion& r = it->second;
  return a - it->first + n <= r.size ? &r : nullptr;
}

}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

TANDEM_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  if (d->sticky != cudaSuccess) return Return(d->sticky);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  uint64_t address = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(AllocateOrSync(lock, *d, size, &address)));
  *ptr = reinterpret_cast<void*>(address);
  return cudaSuccess;
}

// Small allocations go back to their chunk (kept for reuse); large ones are unmapped. Like
// CUDA's, cudaFree synchronizes the device first: work still using the memory finishes
// before its addresses can be handed out again.
TANDEM_API cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  Frontend& f = Frontend::Get();
  const auto a = reinterpret_cast<uint64_t>(ptr);
  DeviceContext* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    d = OwnerOf(a);
    if (!d) return Return(cudaErrorInvalidValue);
  }
  const cudaError_t synced = SyncDevice(*d);
  std::lock_guard<std::mutex> lock(f.mu);
  // Already given back by cudaFreeAsync: a second free.
  if (FreedAsync(a)) return Return(cudaErrorInvalidValue);
  TANDEM_RETURN_CUDA_IF_ERROR(Return(FreeNow(*d, a)));
  // The memory is freed either way; an earlier asynchronous error is reported, as CUDA does.
  return synced == cudaSuccess ? cudaSuccess : Return(synced);
}

// From the current pool of the stream's device (pools.cc has cudaMallocFromPoolAsync).
TANDEM_API cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (!ptr) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  if (Capture* c = CaptureOf(stream)) return Return(Refuse(*c, "cudaMallocAsync (a memory node)"));
  StreamRef s;
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &d, &s)));
  if (d->sticky != cudaSuccess) return Return(d->sticky);
  return Return(StreamOrderedAlloc(lock, *CurrentPool(d->index), *d, s, size, ptr));
}

// Stream-ordered free: nothing waits here. The memory stays allocated until `stream` is known
// to be past this point (a synchronize of the stream's device or of that stream) and is given
// back then; meanwhile only a cudaMallocAsync of the same size on the same stream gets it.
// Other allocations cannot get its addresses, so work still running on it is never handed
// memory in use.
TANDEM_API cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (!ptr) return cudaSuccess;
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  if (Capture* c = CaptureOf(stream)) return Return(Refuse(*c, "cudaFreeAsync (a memory node)"));
  StreamRef s;
  DeviceContext* sd = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &sd, &s)));
  const auto a = reinterpret_cast<uint64_t>(ptr);
  DeviceContext* owner = OwnerOf(a);
  if (!owner || !IsAllocation(*owner, a) || FreedAsync(a)) return Return(cudaErrorInvalidValue);
  if (auto p = f.pooled.find(a); p != f.pooled.end()) {
    p->second.freed = true;
    p->second.pool->used -= p->second.footprint;
  }
  f.freed_async.push_back(
      Frontend::FreedAsync{.stream_device = sd->index, .stream = s.handle, .address = a, .order = ++f.freed_async_count});
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMallocPitch(void** ptr, size_t* pitch, size_t width, size_t height) {
  if (!pitch) return Return(cudaErrorInvalidValue);
  int alignment = 512;
  {
    Frontend& f = Frontend::Get();
    std::lock_guard<std::mutex> lock(f.mu);
    DeviceContext* d = nullptr;
    TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
    alignment = d->Attr(cudaDevAttrTextureAlignment, 512);
  }
  const size_t align = static_cast<size_t>(alignment > 0 ? alignment : 512);
  size_t padded, bytes;
  if (__builtin_add_overflow(width, align - 1, &padded)) return Return(cudaErrorMemoryAllocation);
  *pitch = padded / align * align;
  if (__builtin_mul_overflow(*pitch, height, &bytes)) return Return(cudaErrorMemoryAllocation);
  return cudaMalloc(ptr, bytes);
}

// A pitched allocation of `depth` slices of `height` rows (cudaMallocPitch's pitch).
TANDEM_API cudaError_t cudaMalloc3D(cudaPitchedPtr* p, cudaExtent extent) {
  if (!p) return Return(cudaErrorInvalidValue);
  size_t rows = 0, pitch = 0;
  if (__builtin_mul_overflow(extent.height, extent.depth, &rows)) return Return(cudaErrorMemoryAllocation);
  void* ptr = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(cudaMallocPitch(&ptr, &pitch, extent.width, rows));
  *p = cudaPitchedPtr{.ptr = ptr, .pitch = pitch, .xsize = extent.width, .ysize = extent.height};
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  client::Session& s = d->session();
  const uint64_t device = d->remote();
  lock.unlock();
  auto rep = s.Call(ir::MemInfoReq{.device = device});
  if (!rep.ok()) return Return(ToCuda(rep.status()));
  *free = rep->free;
  *total = rep->total;
  return cudaSuccess;
}

// ---- pinned host memory: client memory, registered with each session on first copy -------

TANDEM_API cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if (!ptr) return Return(cudaErrorInvalidValue);
  // Mapped host memory would be read by kernels on a remote GPU: not supported (and reported
  // so: cudaDevAttrCanMapHostMemory is 0).
  if (flags & cudaHostAllocMapped)
    return Unsupported("cudaHostAlloc(cudaHostAllocMapped): kernels on remote devices cannot reach host memory");
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Return(cudaErrorMemoryAllocation);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  f.host_regions[reinterpret_cast<uintptr_t>(p)] = HostRegion{.base = p, .size = size, .owned = true, .flags = flags};
  *ptr = p;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

TANDEM_API cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  Frontend& f = Frontend::Get();
  // As CUDA synchronizes here: no copy may still be landing in the pages unmapped below.
  f.WaitPending();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.host_regions.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == f.host_regions.end() || !it->second.owned) return Return(cudaErrorInvalidValue);
  // Transfers still in flight hold their own reference to the registration.
  munmap(it->second.base, it->second.size);
  f.host_regions.erase(it);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  if (!ptr || size == 0) return Return(cudaErrorInvalidValue);
  if (flags & cudaHostRegisterMapped)
    return Unsupported("cudaHostRegister(cudaHostRegisterMapped): kernels on remote devices cannot reach host memory");
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  // Overlap with a region already pinned is an error in CUDA too.
  auto next = f.host_regions.lower_bound(a);
  if (next != f.host_regions.end() && next->first < a + size) return Return(cudaErrorHostMemoryAlreadyRegistered);
  if (next != f.host_regions.begin() && std::prev(next)->first + std::prev(next)->second.size > a)
    return Return(cudaErrorHostMemoryAlreadyRegistered);
  f.host_regions[a] = HostRegion{.base = ptr, .size = size, .owned = false, .flags = flags};
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaHostUnregister(void* ptr) {
  Frontend& f = Frontend::Get();
  f.WaitPending();  // copies in flight still use the registration
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.host_regions.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == f.host_regions.end() || it->second.owned) return Return(cudaErrorHostMemoryNotRegistered);
  f.host_regions.erase(it);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaHostGetFlags(unsigned int* flags, void* ptr) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const HostRegion* r = f.FindHost(ptr, 1);
  if (!flags || !r) return Return(cudaErrorInvalidValue);
  *flags = r->flags;
  return cudaSuccess;
}

// Device pointers are ours by address; pinned host memory is known; anything else is plain
// host memory. Host memory is never reachable from remote kernels, so it has no device pointer.
TANDEM_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (!attr) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  *attr = cudaPointerAttributes{};
  if (std::optional<DevicePtr> dp = FindDevicePtr(ptr); dp && dp->room > 0) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = dp->device->index;
    attr->devicePointer = const_cast<void*>(ptr);
  } else if (f.FindHost(ptr, 1)) {
    attr->type = cudaMemoryTypeHost;
    attr->device = CurrentIndex();
    attr->hostPointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
  }
  return cudaSuccess;
}

// A pure value constructor (CUDA arrays themselves are not supported).
TANDEM_API cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w, cudaChannelFormatKind f) {
  return cudaChannelFormatDesc{x, y, z, w, f};
}
