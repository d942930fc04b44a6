// Vector addition: allocation, copies both ways, a launch with the CUDA 13 ABI (or, built
// with -D__NV_LEGACY_LAUNCH, the CUDA 12 one), and memory info.
#include <cstdio>
#include <vector>

#include "check.h"

__global__ void add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main() {
  const int n = 1 << 20;  // 4 MiB per vector: large copies travel by RMA
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = float(i);
    b[i] = float(2 * i);
  }
  float *da, *db, *dc;
  CHECK(cudaMalloc(&da, n * sizeof(float)));
  CHECK(cudaMalloc(&db, n * sizeof(float)));
  CHECK(cudaMalloc(&dc, n * sizeof(float)));
  CHECK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += c[i] != float(3 * i);
  // A small vector too (sub-allocated, copied inline).
  float* ds;
  float small[7] = {1, 2, 3, 4, 5, 6, 7}, out[7] = {};
  CHECK(cudaMalloc(&ds, sizeof small));
  CHECK(cudaMemcpy(ds, small, sizeof small, cudaMemcpyHostToDevice));
  add<<<1, 32>>>(ds, ds, ds, 7);
  CHECK(cudaMemcpy(out, ds, sizeof out, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 7; ++i) wrong += out[i] != 2 * small[i];
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  printf("memory info sane: %s\n", free_b > 0 && free_b <= total_b ? "yes" : "no");
  CHECK(cudaFree(da));
  CHECK(cudaFree(db));
  CHECK(cudaFree(dc));
  CHECK(cudaFree(ds));
  printf("vector_add: %d elements, %d wrong\n", n + 7, wrong);
  return wrong ? 1 : 0;
}
