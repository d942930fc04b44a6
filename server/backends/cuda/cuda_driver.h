// The CUDA driver API as the backend sees it: libcuda.so.1 opened with dlopen and every
// entry point resolved by name at run time, so tandemd builds and runs where there is no
// CUDA. cuda.h is used only for its types and enums; nothing links against libcuda.
#pragma once

#include <cuda.h>

#include <string_view>

#include "tandem/status.h"

namespace tandem::server::cuda {

// Every entry point the backend calls. R: required (the backend refuses to start without
// it); O: optional (newer drivers only; callers check for nullptr). The member names go
// through cuda.h's macros (cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2), so each pointer has
// exactly the type the header declares, and cuGetProcAddress is asked for the version of
// the symbol that matches this header.
#define TANDEM_CUDA_DRIVER_FUNCS(R, O)                                                                       \
  R(cuInit) R(cuGetErrorName) R(cuGetErrorString)                                                           \
  R(cuDeviceGetCount) R(cuDeviceGet) R(cuDeviceGetName) R(cuDeviceGetAttribute) R(cuDeviceTotalMem)         \
  R(cuDeviceGetUuid) R(cuDevicePrimaryCtxRetain) R(cuDevicePrimaryCtxRelease) R(cuDevicePrimaryCtxReset)    \
  R(cuCtxSetCurrent) R(cuCtxSynchronize)                                                                    \
  R(cuMemGetInfo) R(cuMemGetAllocationGranularity) R(cuMemAddressReserve) R(cuMemAddressFree)               \
  R(cuMemCreate) R(cuMemRelease) R(cuMemMap) R(cuMemUnmap) R(cuMemSetAccess)                                \
  R(cuMemHostAlloc) R(cuMemFreeHost) R(cuMemHostGetDevicePointer)                                           \
  R(cuMemcpyHtoDAsync) R(cuMemcpyDtoHAsync) R(cuMemcpyDtoDAsync) R(cuMemcpyPeerAsync)                       \
  R(cuMemcpy3DPeerAsync) R(cuMemsetD8Async) R(cuMemsetD16Async) R(cuMemsetD32Async)                         \
  R(cuModuleLoadData) R(cuModuleUnload) R(cuModuleGetFunction) R(cuModuleGetGlobal)                         \
  R(cuFuncGetAttribute) R(cuFuncSetAttribute) R(cuOccupancyMaxActiveBlocksPerMultiprocessor)                \
  R(cuLaunchKernel) R(cuLaunchCooperativeKernel) R(cuLaunchHostFunc)                                        \
  R(cuStreamCreateWithPriority) R(cuStreamDestroy) R(cuStreamSynchronize) R(cuStreamWaitEvent)              \
  R(cuEventCreate) R(cuEventDestroy) R(cuEventRecord) R(cuEventQuery) R(cuEventSynchronize)                 \
  R(cuEventElapsedTime)                                                                                     \
  O(cuFuncGetParamInfo) O(cuStreamWaitValue32)

struct Driver {
  int version = 0;  // cuDriverGetVersion
#define TANDEM_CUDA_MEMBER(fn) decltype(&::fn) fn = nullptr;
  TANDEM_CUDA_DRIVER_FUNCS(TANDEM_CUDA_MEMBER, TANDEM_CUDA_MEMBER)
#undef TANDEM_CUDA_MEMBER

  // Ok for CUDA_SUCCESS; otherwise the native code with "<call>: <name>: <description>".
  // Out-of-memory results carry Code::kOutOfMemory (with the native code still set).
  Status Check(CUresult r, std::string_view call) const;
};

// Loads libcuda.so.1 and runs cuInit once per process. The table lives for the process
// (the driver is never unloaded). A clear status when the driver or its devices are missing.
Result<const Driver*> LoadDriver();

// Errors after which the context is unusable: every later call of the context fails.
bool IsSticky(CUresult r);

}  // namespace tandem::server::cuda
