/* Vector add: blocking and non-blocking writes, a kernel, a blocking read. */
#include "common.h"

static const char* kSrc =
    "__kernel void vadd(__global const float* a, __global const float* b,\n"
    "                   __global float* c, const unsigned n) {\n"
    "  size_t i = get_global_id(0);\n"
    "  if (i < n) c[i] = a[i] + b[i];\n"
    "}\n";

int main(void) {
  enum { N = 100000 };
  example_env env;
  example_pick(&env, 0);
  static float a[N], b[N], c[N];
  for (int i = 0; i < N; ++i) {
    a[i] = (float)(i % 1000);
    b[i] = (float)(2 * (i % 777));
  }
  cl_mem da = example_buffer(&env, CL_MEM_READ_ONLY, sizeof a, NULL);
  cl_mem db = example_buffer(&env, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof b, b);
  cl_mem dc = example_buffer(&env, CL_MEM_WRITE_ONLY, sizeof c, NULL);
  CHECK(clEnqueueWriteBuffer(env.queue, da, CL_FALSE, 0, sizeof a, a, 0, NULL, NULL));

  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "vadd");
  cl_uint n = N;
  CHECK(clSetKernelArg(k, 0, sizeof da, &da));
  CHECK(clSetKernelArg(k, 1, sizeof db, &db));
  CHECK(clSetKernelArg(k, 2, sizeof dc, &dc));
  CHECK(clSetKernelArg(k, 3, sizeof n, &n));
  size_t global = (N + 63) / 64 * 64, local = 64;
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, &local, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env.queue, dc, CL_TRUE, 0, sizeof c, c, 0, NULL, NULL));

  int bad = 0;
  double sum = 0;
  for (int i = 0; i < N; ++i) {
    if (c[i] != a[i] + b[i]) ++bad;
    sum += c[i];
  }
  printf("vector_add: n=%d mismatches=%d sum=%.1f checksum=%08x\n", N, bad, sum, example_fnv(c, sizeof c));
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseMemObject(da);
  clReleaseMemObject(db);
  clReleaseMemObject(dc);
  example_release(&env);
  return bad ? 1 : 0;
}
