// Host callbacks (cudaStreamAddCallback, cudaLaunchHostFunc) run in stream order, after the
// work queued before them, including an asynchronous copy back to host memory: on their own
// stream, and on the legacy default stream before a callback on a blocking stream. Then one
// thread reads back on the default stream while another queues callbacks there, and one
// synchronizes (stream, event, device) while another queues callbacks one at a time.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
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

void CUDART_CB count_fn(void* data) { static_cast<std::atomic<int>*>(data)->fetch_add(1); }

// Reads back on the default stream, synchronously and asynchronously by turns; 0 or why not.
int ReadBackLoop(const int* d, int n, int rounds) {
  std::vector<int> tmp(n);
  for (int i = 0; i < rounds; ++i) {
    if (i % 2 == 0) {
      CHECK(cudaMemcpy(tmp.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    } else {
      CHECK(cudaMemcpyAsync(tmp.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, 0));
      CHECK(cudaStreamSynchronize(0));
    }
    if (tmp[0] != 7 || tmp[n - 1] != 7) bad++;
  }
  return 0;
}

// Synchronizes the default stream, an event recorded there and the device, in a loop until
// `stop`; 0 or why not.
int SyncLoop(const std::atomic<bool>& stop) {
  cudaEvent_t e;
  CHECK(cudaEventCreate(&e));
  while (!stop.load()) {
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaEventRecord(e, 0));
    CHECK(cudaEventSynchronize(e));
    CHECK(cudaDeviceSynchronize());
  }
  CHECK(cudaEventDestroy(e));
  return 0;
}

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
  // The legacy default stream: work on a blocking stream waits for what stream 0 had queued.
  fill<<<1, n>>>(d, 7, n);
  CHECK(cudaMemcpyAsync(h + n, d, n * sizeof(int), cudaMemcpyDeviceToHost, 0));
  Step legacy{h + n, 7, 5};
  CHECK(cudaLaunchHostFunc(s, host_fn, &legacy));
  CHECK(cudaDeviceSynchronize());
  printf("callbacks ran in order:");
  for (int i : order) printf(" %d", i);
  printf("\ncallbacks saw wrong data: %d\n", bad.load());
  // Two threads on the default stream: read backs and callbacks, neither waiting for ever.
  const int rounds = 300;
  std::atomic<int> ran{0};
  int reader_failed = 0;
  std::thread reader([&] { reader_failed = ReadBackLoop(d, n, rounds); });
  for (int i = 0; i < rounds; ++i) CHECK(cudaLaunchHostFunc(0, count_fn, &ran));
  reader.join();
  CHECK(cudaDeviceSynchronize());
  printf("callbacks beside a reading thread: %d of %d, reads failed: %d, wrong data: %d\n", ran.load(), rounds,
         reader_failed, bad.load());
  // A synchronize waits for the callbacks queued before it. Through Tandem, one queued by
  // another thread just after that wait must not get ahead of the synchronize on the server:
  // its gate would hold the stream the synchronize blocks on, while the callback's own
  // queries wait behind the synchronize (TANDEM_TEST_CALLBACK_GAP_US widens that window).
  const int spaced = 100;
  std::atomic<int> ran_spaced{0};
  std::atomic<bool> stop{false};
  int syncer_failed = 0;
  std::thread syncer([&] { syncer_failed = SyncLoop(stop); });
  for (int i = 0; i < spaced; ++i) {
    CHECK(cudaLaunchHostFunc(0, count_fn, &ran_spaced));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  stop = true;
  syncer.join();
  CHECK(cudaDeviceSynchronize());
  printf("callbacks beside a synchronizing thread: %d of %d, synchronizes failed: %d\n", ran_spaced.load(), spaced,
         syncer_failed);
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaFreeHost(h));
  return bad.load() != 0 || order.size() != 6 || ran.load() != rounds || reader_failed != 0 ||
         ran_spaced.load() != spaced || syncer_failed != 0;
}
