// Does the driver write device printf output through libc's stdout (its FILE buffer), or
// straight to fd 1? Natively, on the GPU machine:
//   nvcc -o /tmp/printf_stdio bench/experiments/native_probes/printf_stdio.cu && /tmp/printf_stdio | cat
// stdout is made fully buffered with a large buffer; after the synchronize that flushes the
// kernel's output, __fpending tells how many bytes wait in that buffer (on stderr). Through
// libc's stdout: the lines' length; straight to fd 1: 0. tandemd's output capture
// (server/backends/cuda/cuda_output.cc) relies on the answer.
#include <stdio_ext.h>

#include <cstdio>

__global__ void say() { printf("device line %d\n", static_cast<int>(threadIdx.x)); }

int main() {
  static char buffer[1 << 20];
  setvbuf(stdout, buffer, _IOFBF, sizeof buffer);
  say<<<1, 4>>>();
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  std::fprintf(stderr, "after the synchronize: %zu bytes in stdout's buffer (4 lines are 60)\n", __fpending(stdout));
  say<<<1, 2>>>();
  cudaDeviceSynchronize();
  std::fprintf(stderr, "after a second kernel: %zu bytes\n", __fpending(stdout));
  return 0;
}
