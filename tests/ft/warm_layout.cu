// A module global's device address must not depend on when the keepalive first ran: a
// fault-tolerant client addresses a global by the primary's address on every replica, and a
// keepalive goes out per link whenever that link has been quiet. The program copies (so the
// keepalive has a path to warm), pauses GAP_MS, then first uses its module: through its
// global's address, a kernel that advances the global, and a read back. It prints the address
// and the values; warm_layout.sh runs it with and without a keepalive in the pause and compares.
//   warm_layout [GAP_MS]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <cuda_runtime.h>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

__device__ uint32_t g_state[16];

__global__ void Advance(uint32_t step) {
  const unsigned i = threadIdx.x;
  g_state[i] = g_state[i] * 2654435761u + step + i;
}

int main(int argc, char** argv) {
  const int gap_ms = argc > 1 ? std::atoi(argv[1]) : 0;
  uint32_t host[16];
  for (uint32_t i = 0; i < 16; ++i) host[i] = 1000u + i;
  uint32_t* buffer = nullptr;
  CHECK(cudaMalloc(&buffer, sizeof host));
  CHECK(cudaMemcpy(buffer, host, sizeof host, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(host, buffer, sizeof host, cudaMemcpyDeviceToHost));
  std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  void* at = nullptr;
  CHECK(cudaGetSymbolAddress(&at, g_state));
  CHECK(cudaMemcpyToSymbol(g_state, host, sizeof host));
  for (uint32_t step = 0; step < 3; ++step) Advance<<<1, 16>>>(step);
  CHECK(cudaGetLastError());
  uint32_t out[16];
  CHECK(cudaMemcpyFromSymbol(out, g_state, sizeof out));
  uint32_t want_sum = 0, sum = 0;
  for (uint32_t i = 0; i < 16; ++i) {
    uint32_t v = host[i];
    for (uint32_t step = 0; step < 3; ++step) v = v * 2654435761u + step + i;
    want_sum += v;
    sum += out[i];
    if (out[i] != v) {
      std::printf("g_state[%u] = %u, expected %u\n", i, out[i], v);
      return 1;
    }
  }
  std::printf("global at %p\nstate sum %u (expected %u)\n", at, sum, want_sum);
  CHECK(cudaFree(buffer));
  return 0;
}
