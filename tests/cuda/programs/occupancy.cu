// Occupancy, function attributes, and opting a kernel in to more dynamic shared memory.
#include <cstdio>

#include "check.h"

__global__ void __launch_bounds__(256) bounded(float* p) { p[threadIdx.x] = threadIdx.x; }

__global__ void reverse(int* p, int n) {
  extern __shared__ int buf[];
  int i = threadIdx.x;
  for (int k = i; k < n; k += blockDim.x) buf[k] = p[k];
  __syncthreads();
  for (int k = i; k < n; k += blockDim.x) p[k] = buf[n - 1 - k];
}

int main() {
  int blocks = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, bounded, 256, 0));
  printf("occupancy of bounded at 256 threads: %d blocks per SM\n", blocks);
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, reverse, 128, 16384, cudaOccupancyDefault));
  printf("occupancy of reverse with 16 KiB shared: %d blocks per SM\n", blocks);

  cudaFuncAttributes fa;
  CHECK(cudaFuncGetAttributes(&fa, bounded));
  printf("bounded: max threads %d, shared %zu, local %zu, ptx %d, binary %d\n", fa.maxThreadsPerBlock,
         fa.sharedSizeBytes, fa.localSizeBytes, fa.ptxVersion, fa.binaryVersion);
  CHECK(cudaFuncGetAttributes(&fa, reverse));
  printf("reverse: max dynamic shared %d\n", fa.maxDynamicSharedSizeBytes);

  // 64 KiB of dynamic shared memory needs an explicit opt-in.
  const int n = 16384;  // ints: 64 KiB
  CHECK(cudaFuncSetAttribute(reverse, cudaFuncAttributeMaxDynamicSharedMemorySize, n * sizeof(int)));
  CHECK(cudaFuncGetAttributes(&fa, reverse));
  printf("reverse after opt-in: max dynamic shared %d\n", fa.maxDynamicSharedSizeBytes);
  int* d;
  static int host[n];
  for (int i = 0; i < n; ++i) host[i] = i;
  CHECK(cudaMalloc(&d, sizeof host));
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
  reverse<<<1, 256, n * sizeof(int)>>>(d, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host[i] != n - 1 - i;
  printf("reverse with 64 KiB shared: %d wrong\n", wrong);
  CHECK(cudaFree(d));
  return wrong ? 1 : 0;
}
