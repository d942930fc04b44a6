/* The main job: a real workload (a tiled 512x512 matrix multiply, then a parallel reduction
 * of the product with __local memory), checked against the CPU; prints the result and where
 * it ran. An ordinary OpenCL program: through `tandem run` it runs on a remote device. */
#include "common.h"

#define TILE 16
#define RED 256

static const char* kSrc =
    "#define TILE 16\n"
    "__kernel void matmul(__global const float* A, __global const float* B, __global float* C, const int n) {\n"
    "  __local float As[TILE][TILE], Bs[TILE][TILE];\n"
    "  int tx = get_local_id(0), ty = get_local_id(1), col = get_global_id(0), row = get_global_id(1);\n"
    "  float acc = 0.0f;\n"
    "  for (int t = 0; t < n / TILE; ++t) {\n"
    "    As[ty][tx] = A[row * n + t * TILE + tx];\n"
    "    Bs[ty][tx] = B[(t * TILE + ty) * n + col];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  }\n"
    "  C[row * n + col] = acc;\n"
    "}\n"
    "/* Sums of |x| per work-group, in a __local tree; integers, so the order does not matter. */\n"
    "__kernel void reduce_abs(__global const float* x, __global long* partial, __local long* s, const int n) {\n"
    "  int g = get_global_id(0), l = get_local_id(0);\n"
    "  s[l] = g < n ? (long)fabs(x[g]) : 0;\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  for (int w = get_local_size(0) / 2; w > 0; w /= 2) {\n"
    "    if (l < w) s[l] += s[l + w];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  }\n"
    "  if (l == 0) partial[get_group_id(0)] = s[0];\n"
    "}\n";

int main(void) {
  enum { N = 512 };
  example_env env;
  example_pick(&env, CL_QUEUE_PROFILING_ENABLE);
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
    for (int k = 0; k < N; ++k) {
      float a = A[r * N + k];
      for (int c = 0; c < N; ++c) ref[r * N + c] += a * B[k * N + c];
    }

  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel mm = example_kernel(prog, "matmul");
  cl_kernel red = example_kernel(prog, "reduce_abs");
  cl_mem dA = example_buffer(&env, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, A);
  cl_mem dB = example_buffer(&env, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, B);
  cl_mem dC = example_buffer(&env, CL_MEM_READ_WRITE, bytes, NULL);
  size_t groups = (size_t)N * N / RED;
  cl_mem dP = example_buffer(&env, CL_MEM_WRITE_ONLY, groups * sizeof(cl_long), NULL);

  cl_int n = N;
  CHECK(clSetKernelArg(mm, 0, sizeof dA, &dA));
  CHECK(clSetKernelArg(mm, 1, sizeof dB, &dB));
  CHECK(clSetKernelArg(mm, 2, sizeof dC, &dC));
  CHECK(clSetKernelArg(mm, 3, sizeof n, &n));
  size_t g2[2] = {N, N}, l2[2] = {TILE, TILE};
  CHECK(clEnqueueNDRangeKernel(env.queue, mm, 2, NULL, g2, l2, 0, NULL, NULL));

  cl_int nn = N * N;
  CHECK(clSetKernelArg(red, 0, sizeof dC, &dC));
  CHECK(clSetKernelArg(red, 1, sizeof dP, &dP));
  CHECK(clSetKernelArg(red, 2, RED * sizeof(cl_long), NULL));
  CHECK(clSetKernelArg(red, 3, sizeof nn, &nn));
  size_t g1 = (size_t)N * N, l1 = RED;
  CHECK(clEnqueueNDRangeKernel(env.queue, red, 1, NULL, &g1, &l1, 0, NULL, NULL));

  cl_long* partial = (cl_long*)malloc(groups * sizeof(cl_long));
  CHECK(clEnqueueReadBuffer(env.queue, dC, CL_FALSE, 0, bytes, C, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env.queue, dP, CL_TRUE, 0, groups * sizeof(cl_long), partial, 0, NULL, NULL));
  CHECK(clFinish(env.queue));

  long long total = 0, ref_total = 0;
  int bad = 0;
  for (size_t i = 0; i < groups; ++i) total += partial[i];
  for (int i = 0; i < N * N; ++i) {
    if (C[i] != ref[i]) ++bad;
    ref_total += (long long)(ref[i] < 0 ? -ref[i] : ref[i]);
  }
  char* pname = example_platform_str(env.platform, CL_PLATFORM_NAME);
  char* dname = example_device_str(env.device, CL_DEVICE_NAME);
  printf("matrix multiply %dx%d (tiled, __local): %s, C[0][0]=%.1f C[%d][%d]=%.1f checksum=%08x\n", N, N,
         bad ? "WRONG" : "matches the CPU", C[0], N - 1, N - 1, C[N * N - 1], example_fnv(C, bytes));
  printf("reduction sum |C| over %zu work-groups: %lld (%s)\n", groups, total,
         total == ref_total ? "matches the CPU" : "WRONG");
  printf("ran on: platform \"%s\", device \"%s\"\n", pname, dname);
  printf("result: %s\n", (!bad && total == ref_total) ? "PASS" : "FAIL");
  free(pname);
  free(dname);
  free(partial);
  free(A);
  free(B);
  free(C);
  free(ref);
  clReleaseMemObject(dA);
  clReleaseMemObject(dB);
  clReleaseMemObject(dC);
  clReleaseMemObject(dP);
  clReleaseKernel(mm);
  clReleaseKernel(red);
  clReleaseProgram(prog);
  example_release(&env);
  return (!bad && total == ref_total) ? 0 : 1;
}
