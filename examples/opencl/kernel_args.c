/* Kernel arguments: a struct by value, scalars of every size, a __local buffer sized by
 * clSetKernelArg(size, NULL), and clGetKernelInfo / clGetKernelWorkGroupInfo; then a program
 * with a kernel of no parameters beside one with a buffer and a scalar. */
#include "common.h"

typedef struct {
  cl_int a;
  cl_float b;
  cl_int c[4];
  cl_long d;
} params_t;

static const char* kSrc =
    "typedef struct { int a; float b; int c[4]; long d; } params_t;\n"
    "__kernel void args(params_t p, char c8, short s16, int i32, long l64, uchar u8, float f,\n"
    "                   __global long* out, __local int* scratch) {\n"
    "  size_t g = get_global_id(0), l = get_local_id(0), n = get_local_size(0);\n"
    "  scratch[l] = (int)g;\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  int neighbour = scratch[(l + 1) % n];\n"
    "  long v = p.a + (long)(p.b * 4.0f) + p.c[g % 4] + p.d + c8 + s16 + i32 + l64 + u8 + (long)(f * 2.0f);\n"
    "  out[g] = v * 1000 + neighbour;\n"
    "}\n";

/* NVIDIA's compiler (driver 580) fails this program when it is built with -cl-kernel-arg-info,
 * which it builds without. */
static const char* kNoParamsSrc =
    "__kernel void no_params(void) {}\n"
    "__kernel void fill(__global int* out, int v) { out[get_global_id(0)] = v + (int)get_global_id(0); }\n";

/* Builds kNoParamsSrc, runs no_params, then fill; 1 when fill wrote what it should. */
static int no_params_program(example_env* env) {
  enum { M = 64 };
  cl_program prog = example_build(env, kNoParamsSrc, NULL);
  cl_kernel none = example_kernel(prog, "no_params"), fill = example_kernel(prog, "fill");
  cl_uint nargs = 1;
  CHECK(clGetKernelInfo(none, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
  size_t one = 1, global = M;
  CHECK(clEnqueueNDRangeKernel(env->queue, none, 1, NULL, &one, NULL, 0, NULL, NULL));
  cl_mem out = example_buffer(env, CL_MEM_WRITE_ONLY, M * sizeof(cl_int), NULL);
  cl_int v = 7;
  CHECK(clSetKernelArg(fill, 0, sizeof out, &out));
  CHECK(clSetKernelArg(fill, 1, sizeof v, &v));
  CHECK(clEnqueueNDRangeKernel(env->queue, fill, 1, NULL, &global, NULL, 0, NULL, NULL));
  cl_int res[M];
  CHECK(clEnqueueReadBuffer(env->queue, out, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL));
  int bad = 0;
  for (int i = 0; i < M; ++i) bad += res[i] != v + i;
  printf("a program with a kernel of no parameters: no_params has %u args and ran; fill: %d mismatches\n", nargs, bad);
  clReleaseMemObject(out);
  clReleaseKernel(fill);
  clReleaseKernel(none);
  clReleaseProgram(prog);
  return nargs == 0 && bad == 0;
}

int main(void) {
  enum { N = 256, L = 64 };
  example_env env;
  example_pick(&env, 0);
  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "args");

  cl_uint nargs = 0;
  CHECK(clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
  char fname[64] = {0};
  CHECK(clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof fname - 1, fname, NULL));
  printf("kernel %s: %u args\n", fname, nargs);
  size_t wg = 0;
  CHECK(clGetKernelWorkGroupInfo(k, env.device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL));
  printf("work group size reported: %s\n", wg >= L ? "yes" : "no");
  EXPECT(wg >= L);

  params_t p = {.a = 5, .b = 2.5f, .c = {1, 2, 3, 4}, .d = 1LL << 33};
  cl_char c8 = -3;
  cl_short s16 = -300;
  cl_int i32 = 70000;
  cl_long l64 = -(1LL << 40);
  cl_uchar u8 = 200;
  cl_float f = 1.5f;
  cl_mem out = example_buffer(&env, CL_MEM_WRITE_ONLY, N * sizeof(cl_long), NULL);
  CHECK(clSetKernelArg(k, 0, sizeof p, &p));
  CHECK(clSetKernelArg(k, 1, sizeof c8, &c8));
  CHECK(clSetKernelArg(k, 2, sizeof s16, &s16));
  CHECK(clSetKernelArg(k, 3, sizeof i32, &i32));
  CHECK(clSetKernelArg(k, 4, sizeof l64, &l64));
  CHECK(clSetKernelArg(k, 5, sizeof u8, &u8));
  CHECK(clSetKernelArg(k, 6, sizeof f, &f));
  CHECK(clSetKernelArg(k, 7, sizeof out, &out));
  CHECK(clSetKernelArg(k, 8, L * sizeof(cl_int), NULL));

  /* A wrong argument must be refused without disturbing the rest. */
  cl_int err = clSetKernelArg(k, 9, sizeof i32, &i32);
  printf("argument index out of range: %s\n", err == CL_INVALID_ARG_INDEX ? "CL_INVALID_ARG_INDEX" : "other");

  size_t global = N, local = L;
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, &local, 0, NULL, NULL));
  cl_long res[N];
  CHECK(clEnqueueReadBuffer(env.queue, out, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL));

  int bad = 0;
  for (int g = 0; g < N; ++g) {
    long long v = p.a + (long long)(p.b * 4.0f) + p.c[g % 4] + p.d + c8 + s16 + i32 + l64 + u8 + (long long)(f * 2.0f);
    int l = g % L, neighbour = g - l + (l + 1) % L;
    if (res[g] != v * 1000 + neighbour) ++bad;
  }
  printf("out[0]=%lld out[%d]=%lld mismatches=%d\n", (long long)res[0], N - 1, (long long)res[N - 1], bad);

  /* The same kernel again with one scalar changed: arguments are captured at enqueue time. */
  cl_int i32b = 1;
  CHECK(clSetKernelArg(k, 3, sizeof i32b, &i32b));
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, &local, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env.queue, out, CL_TRUE, 0, sizeof res, res, 0, NULL, NULL));
  long long want0 = p.a + (long long)(p.b * 4.0f) + p.c[0] + p.d + c8 + s16 + i32b + l64 + u8 + (long long)(f * 2.0f);
  printf("after changing one scalar: out[0]=%lld %s\n", (long long)res[0], res[0] == want0 * 1000 + 1 ? "ok" : "FAIL");

  clReleaseMemObject(out);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  const int no_params_ok = no_params_program(&env);
  example_release(&env);
  return (!bad && res[0] == want0 * 1000 + 1 && err == CL_INVALID_ARG_INDEX && no_params_ok) ? 0 : 1;
}
