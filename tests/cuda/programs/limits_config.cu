// Context limits, cache and shared-memory configuration, PCI bus ids, cudaInitDevice, the
// profiler range, capture-mode exchange, and the stream-ordered allocator (allocations freed
// on a stream and reused by the next allocation on it, a free on one stream and allocations
// on another, memory that only fits once the frees are done).
#include <cuda_profiler_api.h>

#include <cstdio>

#include "check.h"

// Needs the device heap the program asked for: 32 MiB in one block, 4x the default 8 MiB.
__global__ void heap_user(int* ok) {
  char* p = static_cast<char*>(malloc(32u << 20));
  *ok = p != nullptr;
  if (p) {
    p[0] = 1;
    free(p);
  }
}

__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}

__global__ void sum_into(const int* v, int n, unsigned long long* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(out, (unsigned long long)v[i]);
}

// One block: thread 0 waits about `spin` clocks, then the block sums v into *out.
__global__ void slow_sum(const int* v, int n, unsigned long long* out, long long spin) {
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
  }
  __syncthreads();
  unsigned long long s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += (unsigned long long)v[i];
  atomicAdd(out, s);
}

int main() {
  // Limits: set, read back, used by a kernel; an unknown limit is refused by the driver.
  size_t heap = 0, stack = 0, fifo = 0;
  CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
  printf("default heap %zu MiB\n", heap >> 20);
  CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 64u << 20));
  CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
  CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
  CHECK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
  CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 2u << 20));
  CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
  printf("heap %zu MiB, stack %zu, printf fifo %zu MiB\n", heap >> 20, stack, fifo >> 20);
  printf("unknown limit: %s\n", cudaGetErrorName(cudaDeviceSetLimit(static_cast<cudaLimit>(0x77), 1)));
  cudaGetLastError();
  int* ok = nullptr;
  CHECK(cudaMalloc(&ok, sizeof(int)));
  heap_user<<<1, 1>>>(ok);
  CHECK(cudaGetLastError());
  int got = -1;
  CHECK(cudaMemcpy(&got, ok, sizeof got, cudaMemcpyDeviceToHost));
  printf("32 MiB device malloc: %s\n", got ? "ok" : "NULL");

  // Cache and bank configuration.
  cudaFuncCache cache = cudaFuncCachePreferNone;
  CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
  CHECK(cudaDeviceGetCacheConfig(&cache));
  printf("device cache config %d\n", (int)cache);
  CHECK(cudaFuncSetCacheConfig(fill, cudaFuncCachePreferL1));
  printf("bad cache config: %s\n", cudaGetErrorName(cudaDeviceSetCacheConfig(static_cast<cudaFuncCache>(9))));
  cudaGetLastError();
  cudaSharedMemConfig bank = cudaSharedMemBankSizeDefault;
  CHECK(cudaDeviceGetSharedMemConfig(&bank));
  CHECK(cudaDeviceSetSharedMemConfig(cudaSharedMemBankSizeEightByte));
  CHECK(cudaFuncSetSharedMemConfig(fill, cudaSharedMemBankSizeFourByte));
  printf("bank config %d\n", (int)bank);

  // PCI bus id, both ways; cudaInitDevice; the profiler range.
  char bus[32] = {};
  CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
  int by_bus = -1;
  CHECK(cudaDeviceGetByPCIBusId(&by_bus, bus));
  printf("bus id %s -> device %d\n", bus, by_bus);
  printf("bus id of device 99: %s\n", cudaGetErrorName(cudaDeviceGetPCIBusId(bus, sizeof bus, 99)));
  cudaGetLastError();
  CHECK(cudaInitDevice(0, cudaDeviceScheduleSpin, cudaInitDeviceFlagsAreValid));
  unsigned flags = 0;
  CHECK(cudaGetDeviceFlags(&flags));
  printf("flags after cudaInitDevice: schedule spin %d\n", (flags & cudaDeviceScheduleMask) == cudaDeviceScheduleSpin);
  CHECK(cudaProfilerStart());
  CHECK(cudaProfilerStop());
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  cudaStreamCaptureMode back = cudaStreamCaptureModeGlobal;
  CHECK(cudaThreadExchangeStreamCaptureMode(&back));
  printf("capture modes: was %d, then %d\n", (int)mode, (int)back);

  // Stream-ordered allocations: a loop that frees and allocates on one stream, each round's
  // data checked by a kernel that runs after the previous round's free.
  cudaStream_t s, t;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
  unsigned long long* total = nullptr;
  CHECK(cudaMalloc(&total, sizeof *total));
  CHECK(cudaMemsetAsync(total, 0, sizeof *total, s));
  const int n = 1 << 18;
  unsigned long long want = 0;
  for (int round = 0; round < 50; ++round) {
    int* v = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&v), n * sizeof(int), round % 2 ? s : t));
    if (round % 2 == 0) {
      // Allocated in t's order: s waits for it through an event.
      cudaEvent_t e;
      CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CHECK(cudaEventRecord(e, t));
      CHECK(cudaStreamWaitEvent(s, e, 0));
      CHECK(cudaEventDestroy(e));
    }
    fill<<<n / 256, 256, 0, s>>>(v, n, round);
    sum_into<<<n / 256, 256, 0, s>>>(v, n, total);
    CHECK(cudaFreeAsync(v, s));
    for (int i = 0; i < n; ++i) want += (unsigned long long)(round + i);
  }
  unsigned long long have = 0;
  CHECK(cudaMemcpyAsync(&have, total, sizeof have, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  printf("50 rounds of stream-ordered allocations: %s\n", have == want ? "sums match" : "WRONG SUM");

  // Memory freed on s while a kernel there still reads it is not handed to another stream's
  // allocation: t's allocation and fill must not reach it before the kernel has summed it.
  {
    const int m = 2048;
    int* a = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a), m * sizeof(int), s));
    CHECK(cudaMemsetAsync(total, 0, sizeof *total, s));
    fill<<<m / 256, 256, 0, s>>>(a, m, 5);
    slow_sum<<<1, 256, 0, s>>>(a, m, total, 200000000ll);
    CHECK(cudaFreeAsync(a, s));
    int* b = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&b), 256, s));
    int* c = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&c), m * sizeof(int), t));
    CHECK(cudaMemsetAsync(c, 0xff, m * sizeof(int), t));
    CHECK(cudaFreeAsync(b, s));
    CHECK(cudaFreeAsync(c, t));
    CHECK(cudaDeviceSynchronize());
    unsigned long long sum = 0, expect = 0;
    for (int i = 0; i < m; ++i) expect += 5 + i;
    CHECK(cudaMemcpy(&sum, total, sizeof sum, cudaMemcpyDeviceToHost));
    printf("memory freed under a running kernel: %s\n", sum == expect ? "kept until it finished" : "REUSED TOO EARLY");
  }

  // More than the device holds, 1/4 of it at a time, each freed on the stream before the next:
  // only possible if the frees are carried out.
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t quarter = (free_b / 4) & ~((size_t(2) << 20) - 1);
  for (int i = 0; i < 8; ++i) {
    void* p = nullptr;
    CHECK(cudaMallocAsync(&p, quarter, i % 2 ? s : t));
    CHECK(cudaMemsetAsync(p, i, quarter, i % 2 ? s : t));
    CHECK(cudaFreeAsync(p, i % 2 ? s : t));
  }
  CHECK(cudaDeviceSynchronize());
  printf("8 quarters of free memory allocated and freed in stream order\n");
  CHECK(cudaFree(ok));
  CHECK(cudaFree(total));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(t));
  return 0;
}
