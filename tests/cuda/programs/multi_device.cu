// Ordering across two devices by an event: a slow kernel on a non-blocking stream of device
// 0 writes x and an event is recorded after it; a non-blocking stream of device 1 waits on
// the event, copies x over (cudaMemcpyPeerAsync on that stream) and doubles it there. Only
// the event orders the copy after the kernel, so a copy that ran early reads zeros. With one
// device, "device 1" is device 0 again and the output is the same; through Tandem with two
// servers the devices are on different servers (the wait and the copy go server to server).
#include <cstdio>
#include <vector>

#include "check.h"

__global__ void slow_fill(int* x, int n, long long spin) {
  long long start = clock64();
  while (clock64() - start < spin) {
  }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 3 * i + 1;
}

__global__ void twice(int* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= 2;
}

int main() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  const int dev0 = 0, dev1 = count > 1 ? 1 : 0;
  const int n = 1 << 20;
  const int rounds = 3;

  int *x0 = nullptr, *x1 = nullptr;
  cudaStream_t s0, s1;
  cudaEvent_t written;
  CHECK(cudaSetDevice(dev0));
  CHECK(cudaMalloc(&x0, n * sizeof(int)));
  CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  CHECK(cudaSetDevice(dev1));
  CHECK(cudaMalloc(&x1, n * sizeof(int)));
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));

  std::vector<int> host(n);
  long long total = 0;
  for (int r = 0; r < rounds; ++r) {
    CHECK(cudaSetDevice(dev0));
    CHECK(cudaMemset(x0, 0, n * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    // About 20 ms of spinning at 2 GHz before the values are written.
    slow_fill<<<(n + 255) / 256, 256, 0, s0>>>(x0, n, 40000000LL);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(written, s0));
    CHECK(cudaSetDevice(dev1));
    CHECK(cudaStreamWaitEvent(s1, written, 0));
    CHECK(cudaMemcpyPeerAsync(x1, dev1, x0, dev0, n * sizeof(int), s1));
    twice<<<(n + 255) / 256, 256, 0, s1>>>(x1, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(host.data(), x1, n * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      if (host[i] != 2 * (3 * i + 1)) ++bad;
      total += host[i];
    }
    printf("round %d: %d of %d values wrong\n", r, bad, n);
    if (bad) return 1;
  }
  printf("sum of all rounds: %lld\n", total);

  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaFree(x1));
  CHECK(cudaSetDevice(dev0));
  CHECK(cudaEventDestroy(written));
  CHECK(cudaStreamDestroy(s0));
  CHECK(cudaFree(x0));
  return 0;
}
