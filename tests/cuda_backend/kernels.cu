// Kernels the CUDA backend tests load as a fatbinary (nvcc -fatbin at build time).
#include <cstdio>

// Follows pointers stored in device memory: out[i] = *table[i] + 1.
extern "C" __global__ void follow(int** table, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = *table[i] + 1;
}

// Parameters of several sizes and alignments, for cuFuncGetParamInfo.
struct Big {
  double d[5];
};
extern "C" __global__ void shapes(char c, double d, int4 v, Big b, int* out) {
  out[0] = c + static_cast<int>(d) + v.x + v.w + static_cast<int>(b.d[4]);
}

__device__ int counter;
extern "C" __global__ void bump(int by) { atomicAdd(&counter, by); }

extern "C" __global__ void hello(int tag) {
  if (threadIdx.x == 0) printf("hello from the device %d\n", tag);
}

extern "C" __global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Writes through a bad pointer: a sticky CUDA_ERROR_ILLEGAL_ADDRESS.
extern "C" __global__ void fault(int* p) { *reinterpret_cast<volatile int*>(p) = 1; }

// A C++ (mangled) kernel name: _Z5scalePffi.
__global__ void scale(float* p, float f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] *= f;
}
