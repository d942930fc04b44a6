// Device management: the remote devices of TANDEM_SERVERS as CUDA devices, their properties
// (every cudaDeviceProp field that maps to a CUdevice_attribute, from the server's list),
// per-thread current device, synchronisation, reset and versions.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string_view>
#include <vector>

#include "frontend.h"

namespace tandem::cuda {
namespace {

void FillProperties(const DeviceContext& d, cudaDeviceProp* p) {
  *p = cudaDeviceProp{};
  std::strncpy(p->name, d.dev->info.name.c_str(), sizeof(p->name) - 1);
  if (const ir::bytes* uuid = d.dev->Prop(ir::kCudaUuid); uuid && uuid->size() == sizeof(p->uuid))
    std::memcpy(&p->uuid, uuid->data(), sizeof(p->uuid));
  if (const ir::bytes* luid = d.dev->Prop(ir::kCudaLuid); luid && luid->size() == 12) {
    std::memcpy(p->luid, luid->data(), 8);
    std::memcpy(&p->luidDeviceNodeMask, luid->data() + 8, 4);
  }
  uint64_t total = 0;
  d.dev->PropAs<uint64_t>(ir::kCudaTotalMem, &total);
  p->totalGlobalMem = total;
  auto a = [&](cudaDeviceAttr attr) { return d.Attr(attr, 0); };
  auto sz = [&](cudaDeviceAttr attr) { return static_cast<size_t>(static_cast<uint32_t>(d.Attr(attr, 0))); };
  p->sharedMemPerBlock = sz(cudaDevAttrMaxSharedMemoryPerBlock);
  p->regsPerBlock = a(cudaDevAttrMaxRegistersPerBlock);
  p->warpSize = a(cudaDevAttrWarpSize);
  p->memPitch = sz(cudaDevAttrMaxPitch);
  p->maxThreadsPerBlock = a(cudaDevAttrMaxThreadsPerBlock);
  p->maxThreadsDim[0] = a(cudaDevAttrMaxBlockDimX);
  p->maxThreadsDim[1] = a(cudaDevAttrMaxBlockDimY);
  p->maxThreadsDim[2] = a(cudaDevAttrMaxBlockDimZ);
  p->maxGridSize[0] = a(cudaDevAttrMaxGridDimX);
  p->maxGridSize[1] = a(cudaDevAttrMaxGridDimY);
  p->maxGridSize[2] = a(cudaDevAttrMaxGridDimZ);
  p->totalConstMem = sz(cudaDevAttrTotalConstantMemory);
  p->major = a(cudaDevAttrComputeCapabilityMajor);
  p->minor = a(cudaDevAttrComputeCapabilityMinor);
  p->textureAlignment = sz(cudaDevAttrTextureAlignment);
  p->texturePitchAlignment = sz(cudaDevAttrTexturePitchAlignment);
  p->multiProcessorCount = a(cudaDevAttrMultiProcessorCount);
  p->integrated = a(cudaDevAttrIntegrated);
  p->canMapHostMemory = a(cudaDevAttrCanMapHostMemory);
  p->maxTexture1D = a(cudaDevAttrMaxTexture1DWidth);
  p->maxTexture1DMipmap = a(cudaDevAttrMaxTexture1DMipmappedWidth);
  p->maxTexture2D[0] = a(cudaDevAttrMaxTexture2DWidth);
  p->maxTexture2D[1] = a(cudaDevAttrMaxTexture2DHeight);
  p->maxTexture2DMipmap[0] = a(cudaDevAttrMaxTexture2DMipmappedWidth);
  p->maxTexture2DMipmap[1] = a(cudaDevAttrMaxTexture2DMipmappedHeight);
  p->maxTexture2DLinear[0] = a(cudaDevAttrMaxTexture2DLinearWidth);
  p->maxTexture2DLinear[1] = a(cudaDevAttrMaxTexture2DLinearHeight);
  p->maxTexture2DLinear[2] = a(cudaDevAttrMaxTexture2DLinearPitch);
  p->maxTexture2DGather[0] = a(cudaDevAttrMaxTexture2DGatherWidth);
  p->maxTexture2DGather[1] = a(cudaDevAttrMaxTexture2DGatherHeight);
  p->maxTexture3D[0] = a(cudaDevAttrMaxTexture3DWidth);
  p->maxTexture3D[1] = a(cudaDevAttrMaxTexture3DHeight);
  p->maxTexture3D[2] = a(cudaDevAttrMaxTexture3DDepth);
  p->maxTexture3DAlt[0] = a(cudaDevAttrMaxTexture3DWidthAlt);
  p->maxTexture3DAlt[1] = a(cudaDevAttrMaxTexture3DHeightAlt);
  p->maxTexture3DAlt[2] = a(cudaDevAttrMaxTexture3DDepthAlt);
  p->maxTextureCubemap = a(cudaDevAttrMaxTextureCubemapWidth);
  p->maxTexture1DLayered[0] = a(cudaDevAttrMaxTexture1DLayeredWidth);
  p->maxTexture1DLayered[1] = a(cudaDevAttrMaxTexture1DLayeredLayers);
  p->maxTexture2DLayered[0] = a(cudaDevAttrMaxTexture2DLayeredWidth);
  p->maxTexture2DLayered[1] = a(cudaDevAttrMaxTexture2DLayeredHeight);
  p->maxTexture2DLayered[2] = a(cudaDevAttrMaxTexture2DLayeredLayers);
  p->maxTextureCubemapLayered[0] = a(cudaDevAttrMaxTextureCubemapLayeredWidth);
  p->maxTextureCubemapLayered[1] = a(cudaDevAttrMaxTextureCubemapLayeredLayers);
  p->maxSurface1D = a(cudaDevAttrMaxSurface1DWidth);
  p->maxSurface2D[0] = a(cudaDevAttrMaxSurface2DWidth);
  p->maxSurface2D[1] = a(cudaDevAttrMaxSurface2DHeight);
  p->maxSurface3D[0] = a(cudaDevAttrMaxSurface3DWidth);
  p->maxSurface3D[1] = a(cudaDevAttrMaxSurface3DHeight);
  p->maxSurface3D[2] = a(cudaDevAttrMaxSurface3DDepth);
  p->maxSurface1DLayered[0] = a(cudaDevAttrMaxSurface1DLayeredWidth);
  p->maxSurface1DLayered[1] = a(cudaDevAttrMaxSurface1DLayeredLayers);
  p->maxSurface2DLayered[0] = a(cudaDevAttrMaxSurface2DLayeredWidth);
  p->maxSurface2DLayered[1] = a(cudaDevAttrMaxSurface2DLayeredHeight);
  p->maxSurface2DLayered[2] = a(cudaDevAttrMaxSurface2DLayeredLayers);
  p->maxSurfaceCubemap = a(cudaDevAttrMaxSurfaceCubemapWidth);
  p->maxSurfaceCubemapLayered[0] = a(cudaDevAttrMaxSurfaceCubemapLayeredWidth);
  p->maxSurfaceCubemapLayered[1] = a(cudaDevAttrMaxSurfaceCubemapLayeredLayers);
  p->surfaceAlignment = sz(cudaDevAttrSurfaceAlignment);
  p->concurrentKernels = a(cudaDevAttrConcurrentKernels);
  p->ECCEnabled = a(cudaDevAttrEccEnabled);
  p->pciBusID = a(cudaDevAttrPciBusId);
  p->pciDeviceID = a(cudaDevAttrPciDeviceId);
  p->pciDomainID = a(cudaDevAttrPciDomainId);
  p->tccDriver = a(cudaDevAttrTccDriver);
  p->asyncEngineCount = a(cudaDevAttrAsyncEngineCount);
  p->unifiedAddressing = a(cudaDevAttrUnifiedAddressing);
  p->memoryBusWidth = a(cudaDevAttrGlobalMemoryBusWidth);
  p->l2CacheSize = a(cudaDevAttrL2CacheSize);
  p->persistingL2CacheMaxSize = a(cudaDevAttrMaxPersistingL2CacheSize);
  p->maxThreadsPerMultiProcessor = a(cudaDevAttrMaxThreadsPerMultiProcessor);
  p->streamPrioritiesSupported = a(cudaDevAttrStreamPrioritiesSupported);
  p->globalL1CacheSupported = a(cudaDevAttrGlobalL1CacheSupported);
  p->localL1CacheSupported = a(cudaDevAttrLocalL1CacheSupported);
  p->sharedMemPerMultiprocessor = sz(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  p->regsPerMultiprocessor = a(cudaDevAttrMaxRegistersPerMultiprocessor);
  p->managedMemory = a(cudaDevAttrManagedMemory);
  p->isMultiGpuBoard = a(cudaDevAttrIsMultiGpuBoard);
  p->multiGpuBoardGroupID = a(cudaDevAttrMultiGpuBoardGroupID);
  p->hostNativeAtomicSupported = a(cudaDevAttrHostNativeAtomicSupported);
  p->pageableMemoryAccess = a(cudaDevAttrPageableMemoryAccess);
  p->concurrentManagedAccess = a(cudaDevAttrConcurrentManagedAccess);
  p->computePreemptionSupported = a(cudaDevAttrComputePreemptionSupported);
  p->canUseHostPointerForRegisteredMem = a(cudaDevAttrCanUseHostPointerForRegisteredMem);
  p->cooperativeLaunch = a(cudaDevAttrCooperativeLaunch);
  p->sharedMemPerBlockOptin = sz(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  p->pageableMemoryAccessUsesHostPageTables = a(cudaDevAttrPageableMemoryAccessUsesHostPageTables);
  p->directManagedMemAccessFromHost = a(cudaDevAttrDirectManagedMemAccessFromHost);
  p->maxBlocksPerMultiProcessor = a(cudaDevAttrMaxBlocksPerMultiprocessor);
  p->accessPolicyMaxWindowSize = a(cudaDevAttrMaxAccessPolicyWindowSize);
  p->reservedSharedMemPerBlock = sz(cudaDevAttrReservedSharedMemoryPerBlock);
  p->hostRegisterSupported = a(cudaDevAttrHostRegisterSupported);
  p->sparseCudaArraySupported = a(cudaDevAttrSparseCudaArraySupported);
  p->hostRegisterReadOnlySupported = a(cudaDevAttrHostRegisterReadOnlySupported);
  p->timelineSemaphoreInteropSupported = a(cudaDevAttrTimelineSemaphoreInteropSupported);
  p->memoryPoolsSupported = a(cudaDevAttrMemoryPoolsSupported);
  p->gpuDirectRDMASupported = a(cudaDevAttrGPUDirectRDMASupported);
  p->gpuDirectRDMAFlushWritesOptions = static_cast<unsigned>(a(cudaDevAttrGPUDirectRDMAFlushWritesOptions));
  p->gpuDirectRDMAWritesOrdering = a(cudaDevAttrGPUDirectRDMAWritesOrdering);
  p->memoryPoolSupportedHandleTypes = static_cast<unsigned>(a(cudaDevAttrMemoryPoolSupportedHandleTypes));
  p->deferredMappingCudaArraySupported = a(cudaDevAttrDeferredMappingCudaArraySupported);
  p->ipcEventSupported = a(cudaDevAttrIpcEventSupport);
  p->clusterLaunch = a(cudaDevAttrClusterLaunch);
  p->unifiedFunctionPointers = a(static_cast<cudaDeviceAttr>(129));  // CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS
  p->deviceNumaConfig = a(cudaDevAttrNumaConfig);
  p->deviceNumaId = a(cudaDevAttrNumaId);
  p->mpsEnabled = a(cudaDevAttrMpsEnabled);
  p->hostNumaId = a(cudaDevAttrHostNumaId);
  p->gpuPciDeviceID = static_cast<unsigned>(a(cudaDevAttrGpuPciDeviceId));
  p->gpuPciSubsystemID = static_cast<unsigned>(a(cudaDevAttrGpuPciSubsystemId));
  p->hostNumaMultinodeIpcSupported = a(cudaDevAttrHostNumaMultinodeIpcSupported);
}

}  // namespace

// Waits for everything queued on a device (one DeviceSync: cuCtxSynchronize on the
// server, after the host callbacks that gate its streams have run), then reports what went
// wrong asynchronously. Streams other threads destroy meanwhile need no care.
cudaError_t SyncDevice(DeviceContext& d) {
  Frontend& f = Frontend::Get();
  uint64_t freed = 0;  // what cudaFreeAsync gave back before this synchronize
  {
    std::lock_guard<std::mutex> lock(f.mu);
    freed = f.freed_async_count;
  }
  Status st = f.CallAfterCallbacks(d.session(), ir::DeviceSyncReq{.device = d.remote()}).status();
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(f.mu);
    ReleaseFreedAsync(d.index, std::nullopt, freed);
  }
  cudaError_t pending = f.WaitPending();
  cudaError_t async = TakeAsyncErrors(d);
  if (async != cudaSuccess) return async;
  if (!st.ok()) return ToCuda(st);
  return pending;
}

}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

TANDEM_API cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  *count = 0;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  *count = static_cast<int>(list->size());
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaSetDevice(int device) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(device, &d)));
  CurrentIndex() = device;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaGetDevice(int* device) {
  if (!device) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  *device = CurrentIndex();
  return cudaSuccess;
}

// Flags only shape how the host waits; Tandem always waits on a reply. Recorded so that
// cudaGetDeviceFlags reads them back.
TANDEM_API cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  if (flags & ~(cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops))
    return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  d->flags = flags;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  if (!flags) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  *flags = d->flags;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  if (device < 0 || static_cast<size_t>(device) >= list->size()) return Return(cudaErrorInvalidDevice);
  FillProperties(*(*list)[static_cast<size_t>(device)], prop);
  return cudaSuccess;
}

// cudaDeviceAttr values are CUdevice_attribute's: the server's property key is the same.
TANDEM_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  if (device < 0 || static_cast<size_t>(device) >= list->size()) return Return(cudaErrorInvalidDevice);
  const client::Device& dev = *(*list)[static_cast<size_t>(device)]->dev;
  int32_t v = 0;
  if (!dev.PropAs<int32_t>(ir::kCudaAttrBase + static_cast<uint32_t>(attr), &v)) return Return(cudaErrorInvalidValue);
  *value = RemoteLacks(attr) ? 0 : v;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaDeviceSynchronize() {
  Frontend& f = Frontend::Get();
  DeviceContext* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    // CUDA prohibits it during a capture in global mode, and during one of this thread's in
    // thread-local mode, invalidating those captures.
    if (f.capturing.load() > 0) {
      cudaError_t refused = cudaSuccess;
      for (auto& [stream, c] : f.captures) {
        if (c.mode == cudaStreamCaptureModeGlobal ||
            (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id()))
          refused = Invalidate(c);
      }
      if (refused != cudaSuccess) return Return(refused);
    }
    TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
    if (d->sticky != cudaSuccess) return Return(d->sticky);
  }
  return Return(SyncDevice(*d));
}

// Frees everything of the session on the device and forgets it here: allocations, modules
// (reloaded on next use), streams and events of the device, and a sticky error.
TANDEM_API cudaError_t cudaDeviceReset() {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  auto rep = f.CallAfterCallbacks(d->session(), ir::DeviceResetReq{.device = d->remote()});
  d->session().TakeAsyncErrors();
  // This device's own allocations are gone on the server and forgotten below; frees of other
  // devices' memory made on this device's streams are past now, and given back.
  std::erase_if(f.freed_async, [&](const Frontend::FreedAsync& x) {
    return x.address >= d->va_base && x.address - d->va_base < d->va_size;
  });
  if (rep.ok()) ReleaseFreedAsync(d->index, std::nullopt, f.freed_async_count);
  ResetPools(*d);
  DropCaptures(d->index);
  d->allocations.clear();
  d->small.clear();
  d->allocated = 0;
  d->va = std::make_unique<RangeAllocator>(d->va_base, d->va_size);
  d->modules.clear();
  d->functions.clear();
  d->globals.clear();
  d->sticky = cudaSuccess;
  d->flags = 0;
  d->cache_config = cudaFuncCachePreferNone;
  std::erase_if(f.streams, [&](const auto& e) { return e.second->device == d->index; });
  std::erase_if(f.events, [&](const auto& e) { return e.second->device == d->index; });
  return rep.ok() ? cudaSuccess : Return(ToCuda(rep.status()));
}

TANDEM_API cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  *version = 0;  // CUDA's answer where there is no driver
  if (f.Devices(&list) != cudaSuccess || list->empty()) return cudaSuccess;
  int32_t v = 0;
  (*list)[0]->dev->PropAs<int32_t>(ir::kCudaDriverVersion, &v);
  *version = v;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return Return(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (!can) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  const auto n = static_cast<int>(list->size());
  if (device < 0 || device >= n || peer < 0 || peer >= n) return Return(cudaErrorInvalidDevice);
  // A kernel on one remote GPU cannot read another's memory through Tandem (copies between
  // them work: cudaMemcpyPeer goes server to server).
  *can = 0;
  return cudaSuccess;
}

// Truthful with cudaDeviceCanAccessPeer: no device can map another's memory.
TANDEM_API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  if (peer < 0 || peer >= static_cast<int>(list->size())) return Return(cudaErrorInvalidDevice);
  if (flags != 0) return Return(cudaErrorInvalidValue);
  return Return(cudaErrorPeerAccessUnsupported);
}

TANDEM_API cudaError_t cudaDeviceDisablePeerAccess(int peer) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  if (peer < 0 || peer >= static_cast<int>(list->size())) return Return(cudaErrorInvalidDevice);
  return Return(cudaErrorPeerAccessNotEnabled);
}

// ---- limits, cache and shared memory configuration ------------------------------------------

// Asked of the server's context: the driver checks the value, and refuses some limits once
// kernels ran (cudaErrorUnsupportedLimit, cudaErrorInvalidValue). cudaLimit values are CUlimit's;
// the runtime answers cudaErrorInvalidValue for a limit it does not know (seen natively), though
// the driver knows a few more.
TANDEM_API cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value) {
  if (limit < cudaLimitStackSize || limit > cudaLimitPersistingL2CacheSize) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  DeviceContext* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
    if (d->sticky != cudaSuccess) return Return(d->sticky);
  }
  // Setting the stack size waits for the device's work, which a host callback's gate may hold.
  auto rep = f.CallAfterCallbacks(
      d->session(), ir::DeviceSetLimitReq{.device = d->remote(), .limit = static_cast<uint32_t>(limit), .value = value});
  return rep.ok() ? cudaSuccess : Return(ToCuda(rep.status()));
}

TANDEM_API cudaError_t cudaDeviceGetLimit(size_t* value, cudaLimit limit) {
  if (!value) return Return(cudaErrorInvalidValue);
  if (limit < cudaLimitStackSize || limit > cudaLimitPersistingL2CacheSize) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  DeviceContext* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
    if (d->sticky != cudaSuccess) return Return(d->sticky);
  }
  auto rep = d->session().Call(ir::DeviceGetLimitReq{.device = d->remote(), .limit = static_cast<uint32_t>(limit)});
  if (!rep.ok()) return Return(ToCuda(rep.status()));
  *value = static_cast<size_t>(rep->value);
  return cudaSuccess;
}

// A preference (cudaFuncCache values are CUfunc_cache's), kept here for cudaDeviceGetCacheConfig
// and set on the server's context without a round trip.
TANDEM_API cudaError_t cudaDeviceSetCacheConfig(cudaFuncCache config) {
  if (config < cudaFuncCachePreferNone || config > cudaFuncCachePreferEqual) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  if (d->sticky != cudaSuccess) return Return(d->sticky);
  d->session().Post(ir::DeviceSetCacheConfigReq{.device = d->remote(), .config = static_cast<uint32_t>(config)});
  d->cache_config = config;
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaDeviceGetCacheConfig(cudaFuncCache* config) {
  if (!config) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  *config = d->cache_config;
  return cudaSuccess;
}

// Bank size configuration ended with Kepler: on every GPU CUDA 13 runs on, the setters check
// their argument and change nothing, and banks are four bytes wide, which is what CUDA answers.
TANDEM_API cudaError_t cudaDeviceSetSharedMemConfig(cudaSharedMemConfig config) {
  if (config < cudaSharedMemBankSizeDefault || config > cudaSharedMemBankSizeEightByte)
    return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  return Return(f.Current(&d));
}

TANDEM_API cudaError_t cudaDeviceGetSharedMemConfig(cudaSharedMemConfig* config) {
  if (!config) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Current(&d)));
  *config = cudaSharedMemBankSizeFourByte;
  return cudaSuccess;
}

// ---- PCI bus ids, device initialisation ------------------------------------------------------

// The string the server's driver gives (cuDeviceGetPCIBusId), truncated to `len` as CUDA does.
// Devices of different servers may share a bus id.
TANDEM_API cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (!bus_id || len <= 0) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  if (device < 0 || static_cast<size_t>(device) >= list->size()) return Return(cudaErrorInvalidDevice);
  const ir::bytes* id = (*list)[static_cast<size_t>(device)]->dev->Prop(ir::kCudaPciBusId);
  if (!id) return Unsupported("cudaDeviceGetPCIBusId (the server did not report the bus id)");
  const size_t n = std::min(id->size(), static_cast<size_t>(len) - 1);
  std::memcpy(bus_id, id->data(), n);
  bus_id[n] = '\0';
  return cudaSuccess;
}

// The first device, in TANDEM_SERVERS order, whose bus id matches: domain, bus and device
// numbers compared as numbers ("0000:1b:00.0", "1B:00"), as CUDA accepts either form.
TANDEM_API cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* bus_id) {
  if (!device || !bus_id) return Return(cudaErrorInvalidValue);
  auto parse = [](std::string_view s, unsigned* domain, unsigned* bus, unsigned* dev) {
    unsigned v[3] = {0, 0, 0};
    int n = 0;
    size_t i = 0;
    while (n < 3) {
      size_t j = i;
      unsigned x = 0;
      while (j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j])) && j - i < 8) {
        x = x * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(s[j])) ? s[j] - '0'
                                                                                           : std::tolower(s[j]) - 'a' + 10);
        ++j;
      }
      if (j == i) return false;
      v[n++] = x;
      if (j == s.size() || s[j] == '.') break;
      if (s[j] != ':') return false;
      i = j + 1;
    }
    if (n == 2) {  // bus:device
      *domain = 0, *bus = v[0], *dev = v[1];
      return true;
    }
    if (n != 3) return false;
    *domain = v[0], *bus = v[1], *dev = v[2];
    return true;
  };
  unsigned want[3];
  if (!parse(bus_id, &want[0], &want[1], &want[2])) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  for (size_t i = 0; i < list->size(); ++i) {
    const ir::bytes* id = (*list)[i]->dev->Prop(ir::kCudaPciBusId);
    unsigned have[3];
    if (id && parse(std::string_view(reinterpret_cast<const char*>(id->data()), id->size()), &have[0], &have[1], &have[2]) &&
        std::equal(have, have + 3, want)) {
      *device = static_cast<int>(i);
      return cudaSuccess;
    }
  }
  return Return(cudaErrorInvalidDevice);
}

// Sets the device up (its address range on both sides) without making it current; with
// cudaInitDeviceFlagsAreValid, `device_flags` as cudaSetDeviceFlags would set them on it.
TANDEM_API cudaError_t cudaInitDevice(int device, unsigned int device_flags, unsigned int flags) {
  if (flags & ~static_cast<unsigned>(cudaInitDeviceFlagsAreValid)) return Return(cudaErrorInvalidValue);
  const bool set_flags = flags & cudaInitDeviceFlagsAreValid;
  if (set_flags && (device_flags & ~(cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax |
                                     cudaDeviceSyncMemops)))
    return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  std::vector<DeviceContext*>* list = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Devices(&list)));
  if (device < 0 || static_cast<size_t>(device) >= list->size()) return Return(cudaErrorInvalidDevice);
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(f.Device(device, &d)));
  if (set_flags) d->flags = device_flags;
  return cudaSuccess;
}

// Profiling happens where the kernels run: a profiler attached to this process sees no GPU
// work, so these start and stop nothing, as natively when no profiler is attached.
TANDEM_API cudaError_t cudaProfilerStart() {
  static std::once_flag once;
  std::call_once(once, [] { log::Info("cudaProfilerStart: the GPU work runs on the servers; profile tandemd there"); });
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaProfilerStop() { return cudaSuccess; }
