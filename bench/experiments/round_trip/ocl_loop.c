/* ocl_loop idle|launch|read|async [N]: N synchronous OpenCL round trips on one queue: clFinish
 * alone, an empty kernel's enqueue and clFinish (the benchmark's ocl_enqueue_finish), or a
 * blocking 8-byte read back; prints the p50. async: N / 100 times 1000 enqueues and one
 * clFinish, per enqueue (the benchmark's ocl_enqueue_async).
 * Set-up and error checks are the OpenCL examples' (examples/opencl/common.h). */
#include "../../../examples/opencl/common.h"
#include "timing.h"

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "idle";
  const int launch = strcmp(mode, "launch") == 0, read = strcmp(mode, "read") == 0, async = !strcmp(mode, "async");
  EXPECT(launch || read || async || strcmp(mode, "idle") == 0);
  const int n = (argc > 2 ? atoi(argv[2]) : 3000) / (async ? 100 : 1);
  example_env env;
  example_pick(&env, 0);
  cl_program prog = example_build(&env, "__kernel void empty(void) {}", NULL);
  cl_kernel k = example_kernel(prog, "empty");
  size_t g = 1;
  cl_int err = CL_SUCCESS;
  cl_mem buf = clCreateBuffer(env.context, CL_MEM_READ_WRITE, 8, NULL, &err);
  CHECK_ERR(err, "clCreateBuffer");
  const unsigned long long pattern = 0x0123456789abcdefULL;
  CHECK(clEnqueueWriteBuffer(env.queue, buf, CL_TRUE, 0, 8, &pattern, 0, NULL, NULL));
  unsigned long long got = 0;
  double* t = malloc(sizeof(double) * (size_t)n);
  EXPECT(t != NULL && n > 0);
  for (int i = 0; i < n; ++i) {
    double t0 = now_us();
    if (async) {
      for (int j = 0; j < 1000; ++j) CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &g, NULL, 0, NULL, NULL));
      CHECK(clFinish(env.queue));
    } else if (read) {
      CHECK(clEnqueueReadBuffer(env.queue, buf, CL_TRUE, 0, 8, &got, 0, NULL, NULL));
    } else {
      if (launch) CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &g, NULL, 0, NULL, NULL));
      CHECK(clFinish(env.queue));
    }
    t[i] = (now_us() - t0) / (async ? 1000 : 1);
    EXPECT(!read || got == pattern);
  }
  sort_samples(t, n);
  printf("%s: p50 %.1f us p10 %.1f p90 %.1f\n", mode, t[n / 2], t[n / 10], t[9 * n / 10]);
  free(t);
  clReleaseMemObject(buf);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  example_release(&env);
  return 0;
}
