// Pinned (cudaMallocHost, cudaHostAlloc) and registered (cudaHostRegister) host memory,
// synchronous and asynchronous copies from and to it, and cudaPointerGetAttributes; an
// asynchronous read into pageable memory, which returns once the bytes are there; mapped host
// memory offered only where the device says it can map it.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "check.h"

__global__ void twice(int* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= 2;
}

// Spins about `cycles` clocks, then fills p: a read queued behind it waits that long.
__global__ void slow_fill(int* p, int n, int value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = value;
}

const char* type_name(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered: return "unregistered";
    case cudaMemoryTypeHost: return "host";
    case cudaMemoryTypeDevice: return "device";
    case cudaMemoryTypeManaged: return "managed";
  }
  return "?";
}

int main() {
  const int n = 1 << 18;  // 1 MiB of ints: above the inline limit, moved by RMA
  int *pinned, *portable, *d;
  CHECK(cudaMallocHost(&pinned, n * sizeof(int)));
  CHECK(cudaHostAlloc(&portable, n * sizeof(int), cudaHostAllocPortable));
  int* plain = static_cast<int*>(aligned_alloc(4096, n * sizeof(int)));
  CHECK(cudaHostRegister(plain, n * sizeof(int), cudaHostRegisterDefault));
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  int wrong = 0;
  int* buffers[] = {pinned, portable, plain};
  for (int round = 0; round < 3; ++round) {
    int* h = buffers[round];
    for (int i = 0; i < n; ++i) h[i] = i + round;
    // Twice each way: the second copy reuses the cached registration.
    for (int rep = 0; rep < 2; ++rep) {
      CHECK(cudaMemcpyAsync(d, h, n * sizeof(int), cudaMemcpyHostToDevice, 0));
      twice<<<(n + 255) / 256, 256>>>(d, n);
      CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, 0));
      CHECK(cudaStreamSynchronize(0));
    }
    for (int i = 0; i < n; ++i) wrong += h[i] != 4 * (i + round);
    CHECK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    memset(h, 0, n * sizeof(int));
    CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) wrong += h[i] != 4 * (i + round);
  }
  printf("pinned, portable and registered copies: %d wrong\n", wrong);

  cudaPointerAttributes a;
  const void* ptrs[] = {d, d + 100, pinned, plain};
  const char* names[] = {"device", "device+100", "pinned", "registered"};
  for (int i = 0; i < 4; ++i) {
    CHECK(cudaPointerGetAttributes(&a, ptrs[i]));
    printf("%s pointer: type %s%s\n", names[i], type_name(a.type),
           a.type == cudaMemoryTypeDevice ? (a.device == 0 ? " on device 0" : " on another device") : "");
  }
  int stack_value = 0;
  CHECK(cudaPointerGetAttributes(&a, &stack_value));
  printf("stack pointer: type %s\n", type_name(a.type));
  unsigned flags = 0;
  CHECK(cudaHostGetFlags(&flags, portable));

  // cudaMemcpyAsync from the device into pageable memory returns once the copy has completed
  // (CUDA's API synchronization behavior): the bytes may be read at once.
  int* pageable = static_cast<int*>(malloc(n * sizeof(int)));
  memset(pageable, 0, n * sizeof(int));
  slow_fill<<<1, 256>>>(d, n, 7, 200LL * 1000 * 1000);  // some 0.1 s
  CHECK(cudaMemcpyAsync(pageable, d, n * sizeof(int), cudaMemcpyDeviceToHost, 0));
  printf("async read into pageable memory, read at once: %d %d\n", pageable[0], pageable[n - 1]);
  CHECK(cudaDeviceSynchronize());
  free(pageable);

  // Mapped host memory: where the device cannot map it, asking for it is not supported.
  int can_map = -1;
  CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  void* mapped = nullptr;
  cudaError_t mapped_err = cudaHostAlloc(&mapped, 4096, cudaHostAllocMapped);
  printf("mapped host memory offered only where the device maps it: %s\n",
         prop.canMapHostMemory == can_map &&
                 (can_map ? mapped_err == cudaSuccess : mapped_err == cudaErrorNotSupported)
             ? "yes"
             : "no");
  if (mapped_err == cudaSuccess) CHECK(cudaFreeHost(mapped));
  cudaGetLastError();

  CHECK(cudaHostUnregister(plain));
  printf("unregister twice: %s\n", cudaGetErrorName(cudaHostUnregister(plain)));
  cudaGetLastError();
  free(plain);
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFreeHost(portable));
  CHECK(cudaFree(d));
  return wrong ? 1 : 0;
}
