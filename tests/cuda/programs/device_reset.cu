// cudaDeviceReset between rounds of large copies, pageable and pinned, each way: after a
// reset the device starts afresh, and the copies of the next round must still move the right
// bytes (through Tandem the server's host-side staging must survive the context's end).
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.h"

__global__ void add(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += v;
}

int round_trip(int round, int* host, int n, int* wrong) {
  int* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  for (int i = 0; i < n; ++i) host[i] = i ^ round;
  CHECK(cudaMemcpy(d, host, n * sizeof(int), cudaMemcpyHostToDevice));
  add<<<(n + 255) / 256, 256>>>(d, n, round + 1);
  CHECK(cudaGetLastError());
  std::memset(host, 0, n * sizeof(int));
  CHECK(cudaMemcpy(host, d, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) *wrong += host[i] != (i ^ round) + round + 1;
  // An asynchronous pair on a stream of the round's own, then the same bytes again.
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMemcpyAsync(d, host, n * sizeof(int), cudaMemcpyHostToDevice, s));
  add<<<(n + 255) / 256, 256, 0, s>>>(d, n, -(round + 1));
  CHECK(cudaMemcpyAsync(host, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; ++i) *wrong += host[i] != (i ^ round);
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  return 0;
}

int main() {
  const int n = 6 << 20;  // 24 MiB of ints: larger than the server's bulk staging
  std::vector<int> pageable(n);
  int wrong = 0;
  for (int round = 0; round < 3; ++round) {
    int* pinned = nullptr;
    CHECK(cudaMallocHost(&pinned, n * sizeof(int)));
    if (round_trip(round, pageable.data(), n, &wrong) || round_trip(round, pinned, n, &wrong)) return 1;
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaDeviceReset());
  }
  printf("three rounds of 24 MiB copies with a device reset after each: %d wrong\n", wrong);
  return wrong != 0;
}
