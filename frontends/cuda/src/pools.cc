// Memory pools: each device's default pool, pools of cudaMemPoolCreate, the current pool that
// cudaMallocAsync takes from, their attributes and accounting, and cudaMallocFromPoolAsync.
// A pool is a client-side object (MemPool, frontend.h): its memory is ordinary device memory
// of the client's address range, and it holds nothing past a synchronize.
#include <cstring>

#include "frontend.h"

namespace tandem::cuda {

MemPool* DefaultPool(int device) {
  Frontend& f = Frontend::Get();
  MemPool*& p = f.default_pool[device];
  if (!p) {
    auto pool = std::make_unique<MemPool>();
    pool->device = device;
    pool->is_default = true;
    p = pool.get();
    f.pools.emplace(p, std::move(pool));
  }
  return p;
}

std::map<uint64_t, Frontend::Pooled>::iterator Unpool(std::map<uint64_t, Frontend::Pooled>::iterator it) {
  Frontend& f = Frontend::Get();
  MemPool* pool = it->second.pool;
  if (!it->second.freed) pool->used -= it->second.footprint;
  pool->reserved -= it->second.footprint;
  it = f.pooled.erase(it);
  if (pool->destroyed && pool->reserved == 0) f.pools.erase(pool);
  return it;
}

MemPool* CurrentPool(int device) {
  Frontend& f = Frontend::Get();
  auto it = f.current_pool.find(device);
  return it != f.current_pool.end() ? it->second : DefaultPool(device);
}

MemPool* FindPool(const void* handle) {
  Frontend& f = Frontend::Get();
  auto it = f.pools.find(handle);
  return it == f.pools.end() || it->second->destroyed ? nullptr : it->second.get();
}

void ResetPools(DeviceContext& d) {
  Frontend& f = Frontend::Get();
  for (auto it = f.pooled.lower_bound(d.va_base); it != f.pooled.end() && it->first - d.va_base < d.va_size;)
    it = Unpool(it);
  f.current_pool.erase(d.index);
}

namespace {

// The device of a cudaMemLocation for pinned device memory (the only kind Tandem's pools
// hold). Host and managed pools are not supported; anything else is invalid, as in CUDA.
cudaError_t LocationDevice(const cudaMemLocation* location, cudaMemAllocationType type, const char* call, int* device) {
  if (!location) return cudaErrorInvalidValue;
  if (type == cudaMemAllocationTypeManaged) {
    log::Once(std::string(call) + " for managed memory");
    return cudaErrorNotSupported;
  }
  if (type != cudaMemAllocationTypePinned) return cudaErrorInvalidValue;
  if (location->type == cudaMemLocationTypeHost || location->type == cudaMemLocationTypeHostNuma) {
    log::Once(std::string(call) + " for host memory (kernels on remote devices cannot reach it)");
    return cudaErrorNotSupported;
  }
  if (location->type != cudaMemLocationTypeDevice) return cudaErrorInvalidValue;
  DeviceContext* d = nullptr;
  if (Frontend::Get().Device(location->id, &d) != cudaSuccess) return cudaErrorInvalidValue;
  *device = location->id;
  return cudaSuccess;
}

// Whether `device` is one of the program's devices, without setting it up. Needs mu.
bool DeviceIndexValid(int device) {
  std::vector<DeviceContext*>* list = nullptr;
  return Frontend::Get().Devices(&list) == cudaSuccess && device >= 0 && static_cast<size_t>(device) < list->size();
}

cudaError_t SetCurrent(int device, MemPool* pool) {
  if (!pool || pool->device != device) return cudaErrorInvalidValue;
  Frontend& f = Frontend::Get();
  if (pool->is_default) f.current_pool.erase(device);
  else f.current_pool[device] = pool;
  return cudaSuccess;
}

}  // namespace
}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

TANDEM_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (!pool) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(device, &d)));
  *pool = reinterpret_cast<cudaMemPool_t>(DefaultPool(device));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* pool, int device) {
  if (!pool) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(device, &d)));
  *pool = reinterpret_cast<cudaMemPool_t>(CurrentPool(device));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(device, &d)));
  return Return(SetCurrent(device, FindPool(pool)));
}

TANDEM_API cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t* pool, cudaMemLocation* location,
                                                cudaMemAllocationType type) {
  if (!pool) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  int device = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(LocationDevice(location, type, "cudaMemGetDefaultMemPool", &device)));
  *pool = reinterpret_cast<cudaMemPool_t>(DefaultPool(device));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemGetMemPool(cudaMemPool_t* pool, cudaMemLocation* location, cudaMemAllocationType type) {
  if (!pool) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  int device = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(LocationDevice(location, type, "cudaMemGetMemPool", &device)));
  *pool = reinterpret_cast<cudaMemPool_t>(CurrentPool(device));
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemSetMemPool(cudaMemLocation* location, cudaMemAllocationType type, cudaMemPool_t pool) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  int device = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(LocationDevice(location, type, "cudaMemSetMemPool", &device)));
  return Return(SetCurrent(device, FindPool(pool)));
}

// Pinned device memory without export handles: what the pools here can be. maxSize caps what
// the pool reserves at maxSize rounded up to 32 MiB, the driver's chunk: on driver 580 a pool of
// maxSize 4 MiB gives 32 MiB and not 33, one of 33 MiB 64 and not 65, one of 100 MiB 128, and
// two allocations of 17 MiB do not fit in a pool of 32 MiB (native_probes/pool_probe.cu in
// bench/experiments; its output in bench/results/2026-11-27-e).
TANDEM_API cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (!pool || !props) return Return(cudaErrorInvalidValue);
  if (props->handleTypes != cudaMemHandleTypeNone)
    return Unsupported("cudaMemPoolCreate with export handle types (memory shared with other processes)");
  if (props->usage != 0) return Unsupported("cudaMemPoolCreate with usage flags");
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  int device = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(LocationDevice(&props->location, props->allocType, "cudaMemPoolCreate", &device)));
  constexpr uint64_t kChunk = 32u << 20;
  auto p = std::make_unique<MemPool>();
  p->device = device;
  if (props->maxSize) {
    if (props->maxSize > UINT64_MAX - kChunk) return Return(cudaErrorInvalidValue);
    p->cap = (props->maxSize + kChunk - 1) / kChunk * kChunk;
  }
  *pool = reinterpret_cast<cudaMemPool_t>(p.get());
  f.pools.emplace(p.get(), std::move(p));
  return cudaSuccess;
}

// As in CUDA: the pool's allocations stay valid (and are given back as they are freed), and
// a device whose current pool it was takes from its default pool again.
TANDEM_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  MemPool* p = FindPool(pool);
  if (!p || p->is_default) return Return(cudaErrorInvalidValue);
  p->destroyed = true;
  if (auto it = f.current_pool.find(p->device); it != f.current_pool.end() && it->second == p) f.current_pool.erase(it);
  if (p->reserved == 0) f.pools.erase(p);  // nothing counted on it: forgotten now (Unpool otherwise)
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (!value) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  MemPool* p = FindPool(pool);
  if (!p) return Return(cudaErrorInvalidValue);
  uint64_t v64 = 0;
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      std::memcpy(&p->reuse[attr - cudaMemPoolReuseFollowEventDependencies], value, sizeof(int));
      return cudaSuccess;
    case cudaMemPoolAttrReleaseThreshold:
      std::memcpy(&p->release_threshold, value, sizeof(uint64_t));
      return cudaSuccess;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh:  // a high watermark can only be reset (to zero: the current value)
      std::memcpy(&v64, value, sizeof(uint64_t));
      if (v64 != 0) return Return(cudaErrorInvalidValue);
      if (attr == cudaMemPoolAttrReservedMemHigh) p->reserved_high = p->reserved;
      else p->used_high = p->used;
      return cudaSuccess;
    default:  // the current values are read only
      return Return(cudaErrorInvalidValue);
  }
}

TANDEM_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (!value) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  MemPool* p = FindPool(pool);
  if (!p) return Return(cudaErrorInvalidValue);
  uint64_t v64 = 0;
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
      std::memcpy(value, &p->reuse[attr - cudaMemPoolReuseFollowEventDependencies], sizeof(int));
      return cudaSuccess;
    case cudaMemPoolAttrReleaseThreshold: v64 = p->release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent: v64 = p->reserved; break;
    case cudaMemPoolAttrReservedMemHigh: v64 = p->reserved_high; break;
    case cudaMemPoolAttrUsedMemCurrent: v64 = p->used; break;
    case cudaMemPoolAttrUsedMemHigh: v64 = p->used_high; break;
    default: return Return(cudaErrorInvalidValue);
  }
  std::memcpy(value, &v64, sizeof(uint64_t));
  return cudaSuccess;
}

// Nothing to trim: a pool holds no memory past the synchronize that released it, and what was
// freed since may still be in its stream's use as far as this process knows.
TANDEM_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  return FindPool(pool) ? cudaSuccess : Return(cudaErrorInvalidValue);
}

// A pool's own device reads and writes it; no other device can (kernels of another server's
// GPU cannot reach it), so only "no access" is accepted for them.
TANDEM_API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* descs, size_t count) {
  if (!descs && count) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  MemPool* p = FindPool(pool);
  if (!p) return Return(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; ++i) {
    const cudaMemAccessDesc& a = descs[i];
    if (a.location.type != cudaMemLocationTypeDevice || !DeviceIndexValid(a.location.id))
      return Return(cudaErrorInvalidValue);
    if (a.location.id == p->device ? a.flags != cudaMemAccessFlagsProtReadWrite : a.flags != cudaMemAccessFlagsProtNone)
      return Unsupported("cudaMemPoolSetAccess other than read-write for the pool's own device");
  }
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaMemPoolGetAccess(cudaMemAccessFlags* flags, cudaMemPool_t pool, cudaMemLocation* location) {
  if (!flags || !location) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  MemPool* p = FindPool(pool);
  if (!p || location->type != cudaMemLocationTypeDevice || !DeviceIndexValid(location->id))
    return Return(cudaErrorInvalidValue);
  *flags = location->id == p->device ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
  return cudaSuccess;
}

// From `pool`'s device, in `stream`'s order (the stream may be another device's).
TANDEM_API cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream) {
  if (!ptr) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  MemPool* p = FindPool(pool);
  if (!p) return Return(cudaErrorInvalidValue);
  if (Capture* c = CaptureOf(stream)) return Return(Refuse(*c, "cudaMallocFromPoolAsync (a memory node)"));
  StreamRef s;
  DeviceContext* sd = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(StreamTarget(stream, &sd, &s)));
  if (sd->sticky != cudaSuccess) return Return(sd->sticky);
  return Return(StreamOrderedAlloc(lock, *p, *sd, s, size, ptr));
}
