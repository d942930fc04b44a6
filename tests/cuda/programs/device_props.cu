// Device management: count, current device per thread, properties and attributes, flags,
// versions. Prints only what is identical natively and remotely on the same GPU model.
#include <cstdio>
#include <cstring>

#include "check.h"

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  printf("devices: %s\n", count > 0 ? "at least one" : "none");
  CHECK(cudaSetDevice(0));
  int dev = -1;
  CHECK(cudaGetDevice(&dev));
  printf("current device: %d\n", dev);
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("name: %s\n", p.name);
  printf("compute capability: %d.%d\n", p.major, p.minor);
  printf("multiprocessors: %d\n", p.multiProcessorCount);
  printf("warp size: %d, max threads per block: %d, max block: %d x %d x %d\n", p.warpSize, p.maxThreadsPerBlock,
         p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
  printf("max grid: %d x %d x %d\n", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
  printf("shared per block: %zu, opt-in: %zu, registers per block: %d\n", p.sharedMemPerBlock,
         p.sharedMemPerBlockOptin, p.regsPerBlock);
  printf("global memory: %zu MiB\n", p.totalGlobalMem >> 20);
  printf("l2 cache: %d, bus width: %d, const mem: %zu\n", p.l2CacheSize, p.memoryBusWidth, p.totalConstMem);
  static const unsigned char zero[16] = {};
  printf("uuid set: %s\n", memcmp(&p.uuid, zero, 16) ? "yes" : "no");
  int sm = 0, major = 0;
  CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  printf("attributes match properties: %s\n", sm == p.multiProcessorCount && major == p.major ? "yes" : "no");
  printf("invalid device: %s\n", cudaGetErrorName(cudaSetDevice(count + 5)));
  cudaGetLastError();
  int runtime = 0, driver = 0;
  CHECK(cudaRuntimeGetVersion(&runtime));
  CHECK(cudaDriverGetVersion(&driver));
  printf("runtime version: %d, driver at least runtime: %s\n", runtime, driver >= runtime ? "yes" : "no");
  CHECK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  unsigned flags = 0;
  CHECK(cudaGetDeviceFlags(&flags));
  printf("blocking sync flag kept: %s\n", (flags & cudaDeviceScheduleBlockingSync) ? "yes" : "no");
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaDeviceReset());
  // The device is usable again after a reset.
  int* d;
  CHECK(cudaMalloc(&d, 16));
  CHECK(cudaFree(d));
  printf("reset and reused\n");
  return 0;
}
