// Host callbacks (cudaStreamAddCallback, cudaLaunchHostFunc) run in stream order, after the
// work queued before them, including an asynchronous copy back to host memory.
#include <atomic>
#include <cstdio>
#include <mutex>
#include <vector>

#include "check.h"

__global__ void fill(int* p, int value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

struct Step {
  const int* host;
  int expect;
  int index;
};

std::mutex mu;
std::vector<int> order;
std::atomic<int> bad{0};

void record(const Step* s) {
  if (s->host[0] != s->expect || s->host[255] != s->expect) bad++;
  std::lock_guard<std::mutex> lock(mu);
  order.push_back(s->index);
}

void CUDART_CB host_fn(void* data) { record(static_cast<const Step*>(data)); }

void CUDART_CB stream_cb(cudaStream_t, cudaError_t status, void* data) {
  if (status != cudaSuccess) bad++;
  record(static_cast<const Step*>(data));
}

int main() {
  const int n = 256;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int *d, *h;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMallocHost(&h, 4 * n * sizeof(int)));
  Step steps[4];
  for (int k = 0; k < 4; ++k) {
    fill<<<1, n, 0, s>>>(d, k + 1, n);
    CHECK(cudaMemcpyAsync(h + k * n, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    steps[k] = Step{h + k * n, k + 1, k};
    if (k % 2 == 0) CHECK(cudaLaunchHostFunc(s, host_fn, &steps[k]));
    else CHECK(cudaStreamAddCallback(s, stream_cb, &steps[k], 0));
  }
  CHECK(cudaStreamSynchronize(s));
  // The default stream has callbacks too.
  Step last{h, 1, 4};
  CHECK(cudaLaunchHostFunc(0, host_fn, &last));
  CHECK(cudaDeviceSynchronize());
  printf("callbacks ran in order:");
  for (int i : order) printf(" %d", i);
  printf("\ncallbacks saw wrong data: %d\n", bad.load());
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaFreeHost(h));
  return bad.load() != 0 || order.size() != 5;
}
