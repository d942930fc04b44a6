// Asynchronous copies and kernels on several streams, ordered across streams by events;
// event query, synchronize and elapsed time; stream query and priorities.
#include <cstdio>
#include <vector>

#include "check.h"

__global__ void add_one(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1;
}

__global__ void combine(const int* a, const int* b, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * 10 + b[i];
}

int main() {
  const int streams = 4, n = 100000;
  cudaStream_t s[streams];
  for (int k = 0; k < streams; ++k) CHECK(cudaStreamCreateWithFlags(&s[k], k % 2 ? cudaStreamNonBlocking : cudaStreamDefault));
  cudaStream_t prio;
  CHECK(cudaStreamCreateWithPriority(&prio, cudaStreamNonBlocking, -1));
  int p = 0;
  CHECK(cudaStreamGetPriority(prio, &p));
  printf("stream priority read back: %d\n", p);
  // The device's range, and priorities beyond it clamped to it (both ends).
  int least = 1, greatest = 1;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CHECK(cudaDeviceGetStreamPriorityRange(nullptr, &p));
  printf("stream priority range: least %d, greatest %d (greatest alone: %d)\n", least, greatest, p);
  for (int asked : {-1000, 1000, greatest}) {
    cudaStream_t c;
    CHECK(cudaStreamCreateWithPriority(&c, cudaStreamDefault, asked));
    CHECK(cudaStreamGetPriority(c, &p));
    printf("priority %d asked, %d read back\n", asked, p);
    CHECK(cudaStreamDestroy(c));
  }

  std::vector<int*> host(streams), dev(streams);
  cudaEvent_t done[streams];
  for (int k = 0; k < streams; ++k) {
    CHECK(cudaMallocHost(&host[k], n * sizeof(int)));
    CHECK(cudaMalloc(&dev[k], n * sizeof(int)));
    CHECK(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));
    for (int i = 0; i < n; ++i) host[k][i] = k * 1000 + i % 1000;
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, 0));
  for (int k = 0; k < streams; ++k) {
    CHECK(cudaMemcpyAsync(dev[k], host[k], n * sizeof(int), cudaMemcpyHostToDevice, s[k]));
    add_one<<<(n + 255) / 256, 256, 0, s[k]>>>(dev[k], n);
    CHECK(cudaEventRecord(done[k], s[k]));
  }
  // Stream 0 combines streams 1 and 2 once both are done.
  int* out;
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  printf("wait with unknown flags: %s\n", cudaGetErrorName(cudaStreamWaitEvent(s[0], done[1], 0x100)));
  cudaGetLastError();
  CHECK(cudaStreamWaitEvent(s[0], done[1], 0));
  CHECK(cudaStreamWaitEvent(s[0], done[2], 0));
  combine<<<(n + 255) / 256, 256, 0, s[0]>>>(dev[1], dev[2], out, n);
  for (int k = 0; k < streams; ++k)
    CHECK(cudaMemcpyAsync(host[k], dev[k], n * sizeof(int), cudaMemcpyDeviceToHost, s[k]));
  std::vector<int> combined(n);
  CHECK(cudaMemcpyAsync(combined.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost, s[0]));
  CHECK(cudaEventRecord(stop, s[0]));
  CHECK(cudaEventSynchronize(stop));
  for (int k = 1; k < streams; ++k) CHECK(cudaStreamSynchronize(s[k]));
  CHECK(cudaStreamSynchronize(s[0]));
  printf("event query after sync: %s\n", cudaGetErrorName(cudaEventQuery(done[3])));
  printf("stream query after sync: %s\n", cudaGetErrorName(cudaStreamQuery(s[3])));
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  printf("elapsed time non-negative: %s\n", ms >= 0 ? "yes" : "no");
  printf("elapsed time on a timing-disabled event: %s\n",
         cudaGetErrorName(cudaEventElapsedTime(&ms, done[0], stop)));
  cudaGetLastError();
  int wrong = 0;
  for (int k = 0; k < streams; ++k)
    for (int i = 0; i < n; ++i) wrong += host[k][i] != k * 1000 + i % 1000 + 1;
  for (int i = 0; i < n; ++i) wrong += combined[i] != (1000 + i % 1000 + 1) * 10 + (2000 + i % 1000 + 1);
  printf("streams and events: %d streams, %d wrong\n", streams, wrong);
  for (int k = 0; k < streams; ++k) {
    CHECK(cudaStreamDestroy(s[k]));
    CHECK(cudaEventDestroy(done[k]));
    CHECK(cudaFreeHost(host[k]));
    CHECK(cudaFree(dev[k]));
  }
  CHECK(cudaStreamDestroy(prio));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaFree(out));
  return wrong ? 1 : 0;
}
