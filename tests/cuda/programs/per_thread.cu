// Built with --default-stream per-thread: every call that takes or implies a stream reaches
// the runtime under its _ptds / _ptsz name. Two host threads each fill, launch on, copy back
// and check their own buffer through the per-thread default stream; then the stream-ordered
// allocator, events and queries on stream 0 and cudaStreamPerThread.
#include <cstdio>
#include <thread>
#include <vector>

#include "check.h"

__global__ void scale(int* v, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = v[i] * k + i;
}

__constant__ int bias;
__global__ void add_bias(int* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += bias;
}

static int worker(int id, long* sum) {
  const int n = 1 << 16;
  int* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemset(d, 0, n * sizeof(int)));
  std::vector<int> h(n);
  for (int i = 0; i < n; ++i) h[i] = i % 97 + id;
  CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, 0));
  scale<<<(n + 255) / 256, 256>>>(d, n, id + 2);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(0));
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  long s = 0;
  for (int i = 0; i < n; ++i) {
    const int want = (i % 97 + id) * (id + 2) + i;
    if (h[i] != want) {
      printf("thread %d: v[%d] = %d, want %d\n", id, i, h[i], want);
      return 1;
    }
    s += h[i];
  }
  *sum = s;
  CHECK(cudaFree(d));
  return 0;
}

int main() {
  long sums[2] = {0, 0};
  int rc[2] = {0, 0};
  std::thread a([&] { rc[0] = worker(0, &sums[0]); });
  std::thread b([&] { rc[1] = worker(1, &sums[1]); });
  a.join();
  b.join();
  if (rc[0] || rc[1]) return 1;
  printf("threads: sums %ld %ld\n", sums[0], sums[1]);

  // Symbols, 2-D copies and fills, events and queries on the per-thread default stream.
  const int n = 4096;
  int* d = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), n * sizeof(int), cudaStreamPerThread));
  CHECK(cudaMemset2DAsync(d, 64 * sizeof(int), 1, 64 * sizeof(int), n / 64, 0));
  const int b7 = 7;
  CHECK(cudaMemcpyToSymbolAsync(bias, &b7, sizeof b7, 0, cudaMemcpyHostToDevice, 0));
  cudaEvent_t done;
  CHECK(cudaEventCreate(&done));
  add_bias<<<n / 256, 256, 0, cudaStreamPerThread>>>(d, n);
  CHECK(cudaEventRecord(done, 0));
  CHECK(cudaEventSynchronize(done));
  cudaError_t q = cudaStreamQuery(0);
  printf("stream query after its event: %s\n", cudaGetErrorName(q));
  std::vector<int> h(n);
  CHECK(cudaMemcpy2D(h.data(), 64 * sizeof(int), d, 64 * sizeof(int), 64 * sizeof(int), n / 64,
                     cudaMemcpyDeviceToHost));
  int back = 0;
  CHECK(cudaMemcpyFromSymbol(&back, bias, sizeof back));
  long s = 0;
  for (int v : h) s += v;
  printf("fill 0x01010101 + bias %d: sum %ld (want %ld)\n", back, s, (long)n * (0x01010101 + 7));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
  CHECK(cudaStreamIsCapturing(0, &cs));
  printf("capturing: %d\n", (int)cs);
  int dev = -1;
  CHECK(cudaStreamGetDevice(0, &dev));
  printf("stream 0 on device %d\n", dev);
  CHECK(cudaFreeAsync(d, 0));
  CHECK(cudaEventDestroy(done));
  CHECK(cudaDeviceSynchronize());
  return 0;
}
