// The CUDA driver API as the backend sees it: libcuda.so.1 opened with dlopen and every
// entry point resolved by name at run time, so tandemd builds and runs where there is no
// CUDA. cuda.h is used only for its types and enums; nothing links against libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string_view>

#include "tandem/status.h"

namespace tandem::server::cuda {

// Every entry point the backend calls, with the CUDA version whose ABI it is called with.
// R: required (the backend refuses to start without it); O: optional (newer drivers only;
// callers check for nullptr). The version is pinned per entry because cuda.h may declare an
// older ABI than the newest symbol (CUDA 13.0's cuda.h declares cuCtxSynchronize(void), while
// its 13000 version takes a context): each pointer has the type of cudaTypedefs.h's
// PFN_<name>_v<version>, and cuGetProcAddress is asked for exactly that version. The member
// names go through cuda.h's macros (cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2) on both the
// declaration and the call sites, so calls read like the header's.
#define TANDEM_CUDA_DRIVER_FUNCS(R, O)                                                                      \
  R(cuInit, 2000) R(cuGetErrorName, 6000) R(cuGetErrorString, 6000)                                        \
  R(cuDeviceGetCount, 2000) R(cuDeviceGet, 2000) R(cuDeviceGetName, 2000) R(cuDeviceGetAttribute, 2000)    \
  R(cuDeviceTotalMem, 3020) R(cuDeviceGetUuid, 11040) R(cuDevicePrimaryCtxRetain, 7000)                    \
  R(cuDevicePrimaryCtxRelease, 11000) R(cuDevicePrimaryCtxReset, 11000)                                    \
  R(cuCtxSetCurrent, 4000) R(cuCtxGetCurrent, 4000) R(cuCtxSynchronize, 2000)                              \
  R(cuCtxGetStreamPriorityRange, 5050) R(cuCtxSetLimit, 3010) R(cuCtxGetLimit, 3010)                       \
  R(cuCtxSetCacheConfig, 3020) R(cuFuncSetCacheConfig, 3000) R(cuDeviceGetPCIBusId, 4010)                 \
  R(cuMemGetInfo, 3020) R(cuMemGetAllocationGranularity, 10020) R(cuMemAddressReserve, 10020)             \
  R(cuMemAddressFree, 10020) R(cuMemCreate, 10020) R(cuMemRelease, 10020) R(cuMemMap, 10020)               \
  R(cuMemUnmap, 10020) R(cuMemSetAccess, 10020)                                                            \
  R(cuMemHostAlloc, 2020) R(cuMemHostRegister, 6050)                                                      \
  R(cuMemHostGetDevicePointer, 3020)                        \
  R(cuMemcpyHtoDAsync, 3020) R(cuMemcpyDtoHAsync, 3020) R(cuMemcpyDtoDAsync, 3020)                         \
  R(cuMemcpyPeerAsync, 4000) R(cuMemcpy3DPeerAsync, 4000)                                                  \
  R(cuMemsetD8Async, 3020) R(cuMemsetD16Async, 3020) R(cuMemsetD32Async, 3020)                             \
  R(cuModuleLoadData, 2000) R(cuModuleUnload, 2000) R(cuModuleGetFunction, 2000)                           \
  R(cuModuleGetGlobal, 3020) R(cuFuncGetAttribute, 2020) R(cuFuncSetAttribute, 9000)                       \
  R(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050)                                                     \
  R(cuLaunchKernel, 4000) R(cuLaunchCooperativeKernel, 9000) R(cuLaunchHostFunc, 10000) R(cuStreamAddCallback, 5000)                    \
  R(cuStreamCreateWithPriority, 5050) R(cuStreamDestroy, 4000) R(cuStreamSynchronize, 2000)                \
  R(cuStreamWaitEvent, 3020) R(cuEventCreate, 2000) R(cuEventDestroy, 4000) R(cuEventRecord, 2000)         \
  R(cuEventQuery, 2000) R(cuEventSynchronize, 2000) R(cuEventElapsedTime, 12080)                           \
  O(cuFuncGetParamInfo, 12040) O(cuStreamWaitValue32, 11070)

struct Driver {
  int version = 0;  // cuDriverGetVersion
#define TANDEM_CUDA_MEMBER(fn, v) PFN_##fn##_v##v fn = nullptr;
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
