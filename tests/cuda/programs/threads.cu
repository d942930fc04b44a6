// Several host threads at once, each with its own stream, allocations and kernels (as
// OpenMP programs do); each also sets its own current device and sees its own last error.
#include <cstdio>
#include <thread>
#include <vector>

#include "check.h"

__global__ void iota(int* p, int base, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = base + i;
}

int worker(int id, int* wrong) {
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int n = 50000;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  std::vector<int> h(n);
  for (int round = 0; round < 20; ++round) {
    iota<<<(n + 255) / 256, 256, 0, s>>>(d, id * 1000000 + round, n);
    CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i) *wrong += h[i] != id * 1000000 + round + i;
  }
  // An error in this thread is this thread's alone.
  if (id == 0) iota<<<1, 4096, 0, s>>>(d, 0, 1);
  cudaError_t e = cudaGetLastError();
  if ((id == 0) != (e != cudaSuccess)) ++*wrong;
  CHECK(cudaFree(d));
  CHECK(cudaStreamDestroy(s));
  return 0;
}

int main() {
  const int threads = 8;
  std::vector<int> wrong(threads), rc(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { rc[t] = worker(t, &wrong[t]); });
  for (auto& th : pool) th.join();
  int total = 0, failed = 0;
  for (int t = 0; t < threads; ++t) {
    total += wrong[t];
    failed += rc[t];
  }
  printf("threads: %d, failed calls: %d, wrong values: %d\n", threads, failed, total);
  return total || failed;
}
