// CUDA's error semantics: launch configuration errors are reported at once and are not
// sticky, invalid copies fail without harming later work, and names and strings match.
#include <cstdio>

#include "check.h"

__global__ void inc(int* p) { p[threadIdx.x] += 1; }

int main() {
  int* d;
  CHECK(cudaMalloc(&d, 64 * sizeof(int)));
  CHECK(cudaMemset(d, 0, 64 * sizeof(int)));

  inc<<<1, 2048>>>(d);  // more threads per block than any device allows
  cudaError_t e = cudaPeekAtLastError();
  printf("peek after oversized block: %s\n", cudaGetErrorName(e));
  e = cudaGetLastError();
  printf("get after oversized block: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
  printf("get again: %s\n", cudaGetErrorName(cudaGetLastError()));

  inc<<<dim3(1, 1 << 20), 1>>>(d);  // grid y beyond 65535
  printf("oversized grid: %s\n", cudaGetErrorName(cudaGetLastError()));

  int host[64];
  e = cudaMemcpy(nullptr, host, sizeof host, cudaMemcpyHostToDevice);
  printf("copy to a null pointer: %s\n", cudaGetErrorName(e));
  e = cudaMemcpy(host, d, sizeof host, (cudaMemcpyKind)42);
  printf("copy of an unknown kind: %s\n", cudaGetErrorName(e));
  e = cudaFree((void*)0x1234);
  printf("free of a pointer never allocated: %s\n", cudaGetErrorName(e));
  cudaGetLastError();

  // Not sticky: the device still works.
  inc<<<1, 64>>>(d);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < 64; ++i) wrong += host[i] != 1;
  printf("device usable after errors: %s\n", wrong ? "no" : "yes");

  const cudaError_t codes[] = {cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation,
                               cudaErrorInvalidConfiguration, cudaErrorInvalidDeviceFunction,
                               cudaErrorNoDevice, cudaErrorIllegalAddress, cudaErrorNotSupported,
                               cudaErrorNotReady, cudaErrorLaunchFailure, cudaErrorInvalidSymbol};
  for (cudaError_t c : codes) printf("%d %s: %s\n", (int)c, cudaGetErrorName(c), cudaGetErrorString(c));
  CHECK(cudaFree(d));
  return wrong ? 1 : 0;
}
