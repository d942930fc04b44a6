// Kernel launches through every ABI (CUDA 12 cudaLaunchKernel, CUDA 13 __cudaLaunchKernel,
// cudaLaunchKernelExC, cooperative), function attributes and occupancy. A launch is one
// asynchronous Launch command: arguments are packed on the client with the parameter
// layout the server reported once per kernel and device.
#include "frontend.h"

namespace tandem::cuda {
namespace {

constexpr uint32_t kFuncMaxThreads = 0;       // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
constexpr uint32_t kFuncSharedBytes = 1;      // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
constexpr uint32_t kFuncMaxDynShared = 8;     // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

// The checks CUDA makes before a launch reaches the GPU, from the device's limits. CUDA 13
// answers every one of them with cudaErrorInvalidValue (observed natively on driver 580),
// where older runtimes said cudaErrorInvalidConfiguration.
cudaError_t CheckConfig(const DeviceContext& d, dim3 grid, dim3 block, size_t shared) {
  const DeviceContext::LaunchLimits& l = d.Limits();
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const bool bad_block = block.x == 0 || block.y == 0 || block.z == 0 || threads > l.threads ||
                         block.x > l.block[0] || block.y > l.block[1] || block.z > l.block[2];
  const bool bad_grid = grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > l.grid[0] || grid.y > l.grid[1] ||
                        grid.z > l.grid[2];
  const bool bad_shared = shared > l.shared;
  return bad_block || bad_grid || bad_shared ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t Launch(const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream,
                   uint32_t flags) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  const Kernel* k = FindKernel(func);
  if (!k) return cudaErrorInvalidDeviceFunction;
  if (k->fatbin && k->fatbin->managed)
    return Unsupported("kernel launch from a module with __managed__ variables (managed memory)");
  StreamRef s;
  TANDEM_RETURN_CUDA_IF_ERROR(ResolveStream(stream, &s));
  DeviceContext* d = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(f.Device(s.device >= 0 ? s.device : CurrentIndex(), &d));
  if (d->sticky != cudaSuccess) return d->sticky;
  TANDEM_RETURN_CUDA_IF_ERROR(CheckConfig(*d, grid, block, shared));
  const Function* fn = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(EnsureFunction(*d, *k, &fn));
  // Limits of this kernel (registers, __launch_bounds__, opted-in dynamic shared memory).
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads > static_cast<uint64_t>(fn->Attr(kFuncMaxThreads, 1024))) return cudaErrorLaunchOutOfResources;
  if (shared > static_cast<size_t>(fn->Attr(kFuncMaxDynShared, 48 << 10))) return cudaErrorInvalidValue;

  ir::LaunchReq req{.stream = s.handle,
                    .function = fn->handle,
                    .dims = 3,
                    .grid = {grid.x, grid.y, grid.z},
                    .block = {block.x, block.y, block.z},
                    .shared_bytes = static_cast<uint32_t>(shared),
                    .flags = flags};
  const ir::ParamList& params = fn->info.params;
  if (!params.empty() && !args) return cudaErrorInvalidValue;
  if (Capture* c = CaptureOf(stream)) {
    // The arguments' values now, as CUDA captures them; the node launches with them again.
    std::vector<std::vector<uint8_t>> values;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto* p = static_cast<const uint8_t*>(args[i]);
      values.emplace_back(p, p + params[i].size);
    }
    return Record(*c, flags & ir::kLaunchCooperative ? "kernel, cooperative" : "kernel",
                  [func, grid, block, values = std::move(values), shared, flags](cudaStream_t at) {
                    std::vector<void*> ptrs;
                    for (const auto& v : values) ptrs.push_back(const_cast<uint8_t*>(v.data()));
                    return Launch(func, grid, block, ptrs.data(), shared, at, flags);
                  });
  }
  req.args.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(args[i]);
    req.args.push_back(ir::LaunchArg{.kind = static_cast<uint32_t>(ir::ArgKind::kBytes),
                                     .value = 0,
                                     .data = ir::bytes(p, p + params[i].size)});
  }
  d->session().Post(req);
  return cudaSuccess;
}

// Calls `apply` with each device where kernel `k` is loaded and its function there (a setting
// of a kernel is also remembered on it, for devices that load it later). Needs mu.
template <class Apply>
void ForEachLoaded(const Kernel* k, Apply apply) {
  for (DeviceContext* dev : Frontend::Get().known()) {
    auto it = dev->functions.find(k);
    if (it != dev->functions.end()) apply(*dev, it->second);
  }
}

// The function of a cudaFuncGetAttributes-style call on the current device.
cudaError_t CurrentFunction(const void* func, DeviceContext** d, const Function** fn, const Kernel** kernel) {
  Frontend& f = Frontend::Get();
  const Kernel* k = FindKernel(func);
  if (!k) return cudaErrorInvalidDeviceFunction;
  TANDEM_RETURN_CUDA_IF_ERROR(f.Current(d));
  if (kernel) *kernel = k;
  return EnsureFunction(**d, *k, fn);
}

}  // namespace
}  // namespace tandem::cuda

using namespace tandem;
using namespace tandem::cuda;

// CUDA 12 ABI (and programs built with -D__NV_LEGACY_LAUNCH): `func` is the host stub.
TANDEM_API cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shared,
                                        cudaStream_t stream) {
  return Return(Launch(func, grid, block, args, shared, stream, 0));
}

// CUDA 13 ABI: `kernel` comes from __cudaGetKernel.
TANDEM_API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                                          cudaStream_t stream) {
  return Return(Launch(kernel, grid, block, args, shared, stream, 0));
}

// Per-thread default stream builds: Tandem's default stream serves both (see README).
TANDEM_API cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                               size_t shared, cudaStream_t stream) {
  return Return(Launch(kernel, grid, block, args, shared, stream, 0));
}

TANDEM_API cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 grid, dim3 block, void** args,
                                                   size_t shared, cudaStream_t stream) {
  return Return(Launch(func, grid, block, args, shared, stream, ir::kLaunchCooperative));
}

TANDEM_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (!config) return Return(cudaErrorInvalidValue);
  uint32_t flags = 0;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const cudaLaunchAttribute& a = config->attrs[i];
    if (a.id == cudaLaunchAttributeCooperative) {
      if (a.val.cooperative) flags |= ir::kLaunchCooperative;
    } else if (a.id != cudaLaunchAttributeIgnore) {
      log::Once("cudaLaunchKernelExC attribute " + std::to_string(static_cast<int>(a.id)));
      return Return(cudaErrorNotSupported);
    }
  }
  return Return(Launch(func, config->gridDim, config->blockDim, args, config->dynamicSmemBytes, config->stream, flags));
}

TANDEM_API cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  if (!attr) return Return(cudaErrorInvalidValue);
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  const Function* fn = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(CurrentFunction(func, &d, &fn, nullptr)));
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = fn->Attr(kFuncMaxThreads, static_cast<int32_t>(fn->info.max_block));
  attr->sharedSizeBytes = static_cast<size_t>(fn->Attr(kFuncSharedBytes, static_cast<int32_t>(fn->info.local_mem)));
  attr->constSizeBytes = static_cast<size_t>(fn->Attr(2, 0));
  attr->localSizeBytes = static_cast<size_t>(fn->Attr(3, static_cast<int32_t>(fn->info.private_mem)));
  attr->numRegs = fn->Attr(4, 0);
  attr->ptxVersion = fn->Attr(5, 0);
  attr->binaryVersion = fn->Attr(6, 0);
  attr->cacheModeCA = fn->Attr(7, 0);
  attr->maxDynamicSharedSizeBytes = fn->Attr(kFuncMaxDynShared, 0);
  attr->preferredShmemCarveout = fn->Attr(9, -1);
  attr->clusterDimMustBeSet = fn->Attr(10, 0);
  attr->requiredClusterWidth = fn->Attr(11, 0);
  attr->requiredClusterHeight = fn->Attr(12, 0);
  attr->requiredClusterDepth = fn->Attr(13, 0);
  attr->nonPortableClusterSizeAllowed = fn->Attr(14, 0);
  attr->clusterSchedulingPolicyPreference = fn->Attr(15, 0);
  return cudaSuccess;
}

// Remembered on the kernel (for devices that load it later) and applied where it is loaded.
TANDEM_API cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  const Function* fn = nullptr;
  const Kernel* k = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(CurrentFunction(func, &d, &fn, &k)));
  if (attr < cudaFuncAttributeMaxDynamicSharedMemorySize || attr >= cudaFuncAttributeMax) return Return(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
      (value < 0 || value + fn->Attr(kFuncSharedBytes, 0) > d->Attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 << 10)))
    return Return(cudaErrorInvalidValue);
  const auto cu_attr = static_cast<uint32_t>(attr);  // cudaFuncAttribute values are CUfunction_attribute's
  const_cast<Kernel*>(k)->attrs[cu_attr] = value;
  ForEachLoaded(k, [&](DeviceContext& dev, Function& fun) {
    dev.session().Post(ir::FunctionSetAttrReq{.function = fun.handle, .attr = cu_attr, .value = value});
    SetFunctionAttr(fun, cu_attr, value);
  });
  return cudaSuccess;
}

// Remembered on the kernel like its attributes, and set where it is loaded (a preference).
TANDEM_API cudaError_t cudaFuncSetCacheConfig(const void* func, cudaFuncCache config) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  const Function* fn = nullptr;
  const Kernel* k = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(CurrentFunction(func, &d, &fn, &k)));
  if (config < cudaFuncCachePreferNone || config > cudaFuncCachePreferEqual) return Return(cudaErrorInvalidValue);
  const auto value = static_cast<uint32_t>(config);  // cudaFuncCache values are CUfunc_cache's
  const_cast<Kernel*>(k)->cache_config = value;
  ForEachLoaded(k, [&](DeviceContext& dev, Function& fun) {
    dev.session().Post(ir::FunctionSetCacheConfigReq{.function = fun.handle, .config = value});
  });
  return cudaSuccess;
}

// Bank sizes are fixed on every GPU CUDA 13 supports: checked, and nothing changes (as in CUDA).
TANDEM_API cudaError_t cudaFuncSetSharedMemConfig(const void* func, cudaSharedMemConfig config) {
  Frontend& f = Frontend::Get();
  std::lock_guard<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  const Function* fn = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(CurrentFunction(func, &d, &fn, nullptr)));
  if (config < cudaSharedMemBankSizeDefault || config > cudaSharedMemBankSizeEightByte) return Return(cudaErrorInvalidValue);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void* func,
                                                                             int block_size, size_t shared,
                                                                             unsigned int flags) {
  if (!blocks || block_size <= 0) return Return(cudaErrorInvalidValue);
  if (flags != cudaOccupancyDefault) {
    log::Once("cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags with flags other than cudaOccupancyDefault");
    return Return(cudaErrorNotSupported);
  }
  Frontend& f = Frontend::Get();
  std::unique_lock<std::mutex> lock(f.mu);
  DeviceContext* d = nullptr;
  const Function* fn = nullptr;
  TANDEM_RETURN_CUDA_IF_ERROR(Return(CurrentFunction(func, &d, &fn, nullptr)));
  const uint64_t handle = fn->handle;
  client::Session& session = d->session();
  lock.unlock();
  auto rep = session.Call(ir::OccupancyReq{.function = handle, .block = static_cast<uint32_t>(block_size),
                                           .shared_bytes = shared});
  if (!rep.ok()) return Return(ToCuda(rep.status()));
  *blocks = static_cast<int>(rep->blocks);
  return cudaSuccess;
}

TANDEM_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func, int block_size,
                                                                    size_t shared) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, func, block_size, shared, cudaOccupancyDefault);
}
