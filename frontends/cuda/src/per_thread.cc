// The entry points of programs built with --default-stream per-thread (nvcc renames the calls
// that take or imply a stream: cudaMemcpy becomes cudaMemcpy_ptds, cudaMemcpyAsync becomes
// cudaMemcpyAsync_ptsz). Tandem runs the per-thread default stream as the device's default
// stream (README), so each is the call without the suffix. That only adds ordering: work of
// two threads' default streams runs one after the other, never out of the order a program
// wrote. The static_asserts hold every signature to the one the runtime header declares.
#include <type_traits>

#include "frontend.h"

#define TANDEM_PER_THREAD(base, suffix, params, args)                                   \
  TANDEM_API cudaError_t base##suffix params { return base args; }                      \
  static_assert(std::is_same_v<decltype(base), decltype(base##suffix)>,                 \
                #base #suffix " must take what " #base " takes");

// Synchronous copies and fills on the (per-thread) default stream.
TANDEM_PER_THREAD(cudaMemcpy, _ptds, (void* dst, const void* src, size_t count, cudaMemcpyKind kind),
                  (dst, src, count, kind))
TANDEM_PER_THREAD(cudaMemcpy2D, _ptds,
                  (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                   cudaMemcpyKind kind),
                  (dst, dpitch, src, spitch, width, height, kind))
TANDEM_PER_THREAD(cudaMemcpyToSymbol, _ptds,
                  (const void* symbol, const void* src, size_t count, size_t offset, cudaMemcpyKind kind),
                  (symbol, src, count, offset, kind))
TANDEM_PER_THREAD(cudaMemcpyFromSymbol, _ptds,
                  (void* dst, const void* symbol, size_t count, size_t offset, cudaMemcpyKind kind),
                  (dst, symbol, count, offset, kind))
TANDEM_PER_THREAD(cudaMemset, _ptds, (void* ptr, int value, size_t count), (ptr, value, count))
TANDEM_PER_THREAD(cudaMemset2D, _ptds, (void* ptr, size_t pitch, int value, size_t width, size_t height),
                  (ptr, pitch, value, width, height))

TANDEM_PER_THREAD(cudaMemcpy3D, _ptds, (const cudaMemcpy3DParms* p), (p))
TANDEM_PER_THREAD(cudaMemset3D, _ptds, (cudaPitchedPtr ptr, int value, cudaExtent extent), (ptr, value, extent))

// Calls that take a stream, where 0 means the per-thread default stream.
TANDEM_PER_THREAD(cudaMemcpy3DAsync, _ptsz, (const cudaMemcpy3DParms* p, cudaStream_t stream), (p, stream))
TANDEM_PER_THREAD(cudaMemset3DAsync, _ptsz, (cudaPitchedPtr ptr, int value, cudaExtent extent, cudaStream_t stream),
                  (ptr, value, extent, stream))
TANDEM_PER_THREAD(cudaMemcpyAsync, _ptsz,
                  (void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream),
                  (dst, src, count, kind, stream))
TANDEM_PER_THREAD(cudaMemcpy2DAsync, _ptsz,
                  (void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                   cudaMemcpyKind kind, cudaStream_t stream),
                  (dst, dpitch, src, spitch, width, height, kind, stream))
TANDEM_PER_THREAD(cudaMemcpyToSymbolAsync, _ptsz,
                  (const void* symbol, const void* src, size_t count, size_t offset, cudaMemcpyKind kind,
                   cudaStream_t stream),
                  (symbol, src, count, offset, kind, stream))
TANDEM_PER_THREAD(cudaMemcpyFromSymbolAsync, _ptsz,
                  (void* dst, const void* symbol, size_t count, size_t offset, cudaMemcpyKind kind,
                   cudaStream_t stream),
                  (dst, symbol, count, offset, kind, stream))
TANDEM_PER_THREAD(cudaMemsetAsync, _ptsz, (void* ptr, int value, size_t count, cudaStream_t stream),
                  (ptr, value, count, stream))
TANDEM_PER_THREAD(cudaMemset2DAsync, _ptsz,
                  (void* ptr, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream),
                  (ptr, pitch, value, width, height, stream))
TANDEM_PER_THREAD(cudaMallocAsync, _ptsz, (void** ptr, size_t size, cudaStream_t stream), (ptr, size, stream))
TANDEM_PER_THREAD(cudaMallocFromPoolAsync, _ptsz, (void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream),
                  (ptr, size, pool, stream))
TANDEM_PER_THREAD(cudaFreeAsync, _ptsz, (void* ptr, cudaStream_t stream), (ptr, stream))
TANDEM_PER_THREAD(cudaLaunchKernel, _ptsz,
                  (const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream),
                  (func, grid, block, args, shared, stream))
TANDEM_PER_THREAD(cudaLaunchCooperativeKernel, _ptsz,
                  (const void* func, dim3 grid, dim3 block, void** args, size_t shared, cudaStream_t stream),
                  (func, grid, block, args, shared, stream))
TANDEM_PER_THREAD(cudaLaunchKernelExC, _ptsz, (const cudaLaunchConfig_t* config, const void* func, void** args),
                  (config, func, args))
TANDEM_PER_THREAD(cudaLaunchHostFunc, _ptsz, (cudaStream_t stream, cudaHostFn_t fn, void* data), (stream, fn, data))
TANDEM_PER_THREAD(cudaStreamAddCallback, _ptsz,
                  (cudaStream_t stream, cudaStreamCallback_t callback, void* data, unsigned int flags),
                  (stream, callback, data, flags))
TANDEM_PER_THREAD(cudaEventRecord, _ptsz, (cudaEvent_t event, cudaStream_t stream), (event, stream))
TANDEM_PER_THREAD(cudaEventRecordWithFlags, _ptsz, (cudaEvent_t event, cudaStream_t stream, unsigned int flags),
                  (event, stream, flags))
TANDEM_PER_THREAD(cudaStreamWaitEvent, _ptsz, (cudaStream_t stream, cudaEvent_t event, unsigned int flags),
                  (stream, event, flags))
TANDEM_PER_THREAD(cudaStreamSynchronize, _ptsz, (cudaStream_t stream), (stream))
TANDEM_PER_THREAD(cudaStreamQuery, _ptsz, (cudaStream_t stream), (stream))
TANDEM_PER_THREAD(cudaStreamGetFlags, _ptsz, (cudaStream_t stream, unsigned int* flags), (stream, flags))
TANDEM_PER_THREAD(cudaStreamGetPriority, _ptsz, (cudaStream_t stream, int* priority), (stream, priority))
TANDEM_PER_THREAD(cudaStreamGetDevice, _ptsz, (cudaStream_t stream, int* device), (stream, device))
TANDEM_PER_THREAD(cudaStreamIsCapturing, _ptsz, (cudaStream_t stream, cudaStreamCaptureStatus* status),
                  (stream, status))
TANDEM_PER_THREAD(cudaStreamGetCaptureInfo, _ptsz,
                  (cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id, cudaGraph_t* graph,
                   const cudaGraphNode_t** dependencies, const cudaGraphEdgeData** edge_data, size_t* count),
                  (stream, status, id, graph, dependencies, edge_data, count))

// Stream capture and graph launches (graphs.cc).
TANDEM_PER_THREAD(cudaStreamBeginCapture, _ptsz, (cudaStream_t stream, cudaStreamCaptureMode mode), (stream, mode))
TANDEM_PER_THREAD(cudaStreamEndCapture, _ptsz, (cudaStream_t stream, cudaGraph_t* graph), (stream, graph))
TANDEM_PER_THREAD(cudaGraphLaunch, _ptsz, (cudaGraphExec_t exec, cudaStream_t stream), (exec, stream))
TANDEM_PER_THREAD(cudaGraphUpload, _ptsz, (cudaGraphExec_t exec, cudaStream_t stream), (exec, stream))
