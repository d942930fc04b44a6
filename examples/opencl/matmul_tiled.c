/* Tiled matrix multiply with __local memory, checked against the CPU. The inputs are small
 * integers, so every product and sum is exact in float and the checksum is the same on
 * any device. */
#include "common.h"

#define TILE 16

static const char* kSrc =
    "#define TILE 16\n"
    "__kernel void matmul(__global const float* A, __global const float* B,\n"
    "                     __global float* C, const int n) {\n"
    "  __local float As[TILE][TILE];\n"
    "  __local float Bs[TILE][TILE];\n"
    "  int tx = get_local_id(0), ty = get_local_id(1);\n"
    "  int col = get_global_id(0), row = get_global_id(1);\n"
    "  float acc = 0.0f;\n"
    "  for (int t = 0; t < n / TILE; ++t) {\n"
    "    As[ty][tx] = A[row * n + t * TILE + tx];\n"
    "    Bs[ty][tx] = B[(t * TILE + ty) * n + col];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  }\n"
    "  C[row * n + col] = acc;\n"
    "}\n";

int main(void) {
  enum { N = 256 };
  example_env env;
  example_pick(&env, 0);
  size_t bytes = sizeof(float) * N * N;
  float* A = (float*)malloc(bytes);
  float* B = (float*)malloc(bytes);
  float* C = (float*)malloc(bytes);
  float* ref = (float*)calloc(N * N, sizeof(float));
  for (int i = 0; i < N * N; ++i) {
    A[i] = (float)((i * 7 + 3) % 11) - 5.0f;
    B[i] = (float)((i * 13 + 1) % 9) - 4.0f;
  }
  for (int r = 0; r < N; ++r)
    for (int k = 0; k < N; ++k)
      for (int c = 0; c < N; ++c) ref[r * N + c] += A[r * N + k] * B[k * N + c];

  cl_mem dA = example_buffer(&env, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, A);
  cl_mem dB = example_buffer(&env, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, B);
  cl_mem dC = example_buffer(&env, CL_MEM_WRITE_ONLY, bytes, NULL);
  cl_program prog = example_build(&env, kSrc, "-cl-std=CL1.2");
  cl_kernel k = example_kernel(prog, "matmul");
  cl_int n = N;
  CHECK(clSetKernelArg(k, 0, sizeof dA, &dA));
  CHECK(clSetKernelArg(k, 1, sizeof dB, &dB));
  CHECK(clSetKernelArg(k, 2, sizeof dC, &dC));
  CHECK(clSetKernelArg(k, 3, sizeof n, &n));
  size_t global[2] = {N, N}, local[2] = {TILE, TILE};
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 2, NULL, global, local, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env.queue, dC, CL_TRUE, 0, bytes, C, 0, NULL, NULL));

  int bad = 0;
  double sum = 0, trace = 0;
  for (int i = 0; i < N * N; ++i) {
    if (C[i] != ref[i]) ++bad;
    sum += C[i];
  }
  for (int i = 0; i < N; ++i) trace += C[i * N + i];
  printf("matmul_tiled: %dx%d tile=%d mismatches=%d\n", N, N, TILE, bad);
  printf("matmul_tiled: sum=%.1f trace=%.1f C[17][42]=%.1f checksum=%08x\n", sum, trace,
         C[17 * N + 42], example_fnv(C, bytes));
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseMemObject(dA);
  clReleaseMemObject(dB);
  clReleaseMemObject(dC);
  example_release(&env);
  free(A);
  free(B);
  free(C);
  free(ref);
  return bad ? 1 : 0;
}
