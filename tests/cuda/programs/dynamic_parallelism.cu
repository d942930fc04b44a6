// Dynamic parallelism (-rdc=true -lcudadevrt): a parent kernel launches child grids; the
// device-linked image is what registration ships.
#include <cstdio>

#include "check.h"

__global__ void child(int* data, int base) { data[base + threadIdx.x] = base + threadIdx.x; }

__global__ void parent(int* data, int chunks, int width) {
  if (threadIdx.x < chunks) child<<<1, width>>>(data, threadIdx.x * width);
}

int main() {
  const int chunks = 8, width = 32, n = chunks * width;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemset(d, 0xff, n * sizeof(int)));
  parent<<<1, chunks>>>(d, chunks, width);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  int host[n];
  CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host[i] != i;
  printf("dynamic parallelism: %d child grids, %d wrong\n", chunks, wrong);
  CHECK(cudaFree(d));
  return wrong ? 1 : 0;
}
