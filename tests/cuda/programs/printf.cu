// Device printf reaches the program's stdout, in order, before the sync that follows it.
#include <cstdio>

#include "check.h"

__global__ void hello(int launch, int value) {
  if (threadIdx.x == 0 && blockIdx.x == 0) printf("kernel %d says %d (%s)\n", launch, value, "text");
}

__global__ void per_block() { if (threadIdx.x == 0) printf("block %d\n", blockIdx.x); }

int main() {
  printf("host before\n");
  fflush(stdout);
  for (int i = 0; i < 3; ++i) {
    hello<<<2, 32>>>(i, i * i);
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);
  }
  // One block at a time keeps the order deterministic.
  for (int b = 0; b < 3; ++b) {
    per_block<<<1, 1>>>();
    CHECK(cudaDeviceSynchronize());
    fflush(stdout);
  }
  printf("host after\n");
  return 0;
}
