// Shared by the test programs: stop at the first failing CUDA call, naming it.
#pragma once
#include <cstdio>

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_));             \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
