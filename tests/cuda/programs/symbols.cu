// __constant__ and __device__ symbols: cudaMemcpyToSymbol/FromSymbol (sync and async),
// cudaGetSymbolAddress/Size, and kernels that read and write them.
#include <cstdio>

#include "check.h"

__constant__ float coeff[4];
__device__ int counter;
__device__ int table[64];

__global__ void use(float* out) {
  int i = threadIdx.x;
  out[i] = coeff[i % 4] * i;
  atomicAdd(&counter, 1);
  table[i] = i * 3;
}

int main() {
  const float c[4] = {0.5f, 1.f, 2.f, 4.f};
  CHECK(cudaMemcpyToSymbol(coeff, c, sizeof c));
  int zero = 0;
  CHECK(cudaMemcpyToSymbol(counter, &zero, sizeof zero));
  size_t size = 0;
  CHECK(cudaGetSymbolSize(&size, table));
  printf("sizeof table: %zu\n", size);
  CHECK(cudaGetSymbolSize(&size, coeff));
  printf("sizeof coeff: %zu\n", size);
  float* out;
  CHECK(cudaMalloc(&out, 64 * sizeof(float)));
  use<<<1, 64>>>(out);
  CHECK(cudaGetLastError());
  float host[64];
  CHECK(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < 64; ++i) wrong += host[i] != c[i % 4] * i;
  int count = 0;
  CHECK(cudaMemcpyFromSymbol(&count, counter, sizeof count));
  printf("counter: %d\n", count);
  // The symbol's address works like any device pointer.
  int* table_ptr = nullptr;
  CHECK(cudaGetSymbolAddress((void**)&table_ptr, table));
  int t[64];
  CHECK(cudaMemcpy(t, table_ptr, sizeof t, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 64; ++i) wrong += t[i] != i * 3;
  // Offsets and the asynchronous forms.
  int five = 5, back = 0;
  CHECK(cudaMemcpyToSymbolAsync(table, &five, sizeof five, 10 * sizeof(int), cudaMemcpyHostToDevice, 0));
  CHECK(cudaMemcpyFromSymbolAsync(&back, table, sizeof back, 10 * sizeof(int), cudaMemcpyDeviceToHost, 0));
  CHECK(cudaStreamSynchronize(0));
  printf("table[10] after async write: %d\n", back);
  // Past the end of the symbol: an error, as in CUDA.
  cudaError_t e = cudaMemcpyToSymbol(coeff, c, sizeof c, 4);
  printf("copy past the end of coeff: %s\n", cudaGetErrorName(e));
  cudaGetLastError();
  printf("symbols: %d wrong\n", wrong);
  CHECK(cudaFree(out));
  return wrong || count != 64 || back != 5;
}
