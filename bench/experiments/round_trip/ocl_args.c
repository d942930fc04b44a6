/* ocl_args [N] [burst]: an empty kernel's enqueue + clFinish, N times each for a kernel without
 * arguments and one with a buffer argument (set once), interleaved; prints each one's p50 and
 * p10 (us). With `burst`, first 30 times 1000 enqueues and one clFinish, as the benchmark's
 * ocl_enqueue_async does right before its ocl_enqueue_finish. OCL_ARGS_BYTES sets the buffer's
 * size (default 64; the benchmark's is 256 MiB), OCL_ARGS_WRITE=1 writes 4 bytes into it
 * first (blocking), as the benchmark's warm-up does. The benchmark's ocl_enqueue_finish
 * launches the second kind, round_trip/ocl_loop the first: through tandemd the benchmark's row
 * was 3-5 us further from native than the probe's (bench/results/2026-11-27-g.md).
 * Set-up and error checks are the OpenCL examples' (examples/opencl/common.h). */
#include "../../../examples/opencl/common.h"
#include "timing.h"
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2000;
  example_env env; example_pick(&env, 0);
  cl_program prog = example_build(&env, "__kernel void empty(void) {}\n__kernel void arg(__global int* p) {}", NULL);
  cl_kernel k[2] = {example_kernel(prog, "empty"), example_kernel(prog, "arg")};
  cl_int err; const char* bytes = getenv("OCL_ARGS_BYTES");
  cl_mem buf = clCreateBuffer(env.context, CL_MEM_READ_WRITE, bytes ? strtoull(bytes, NULL, 10) : 64, NULL, &err);
  CHECK_ERR(err, "clCreateBuffer");
  const char* write = getenv("OCL_ARGS_WRITE");
  if (write && strcmp(write, "1") == 0) {
    int z = 0;
    CHECK(clEnqueueWriteBuffer(env.queue, buf, CL_TRUE, 0, sizeof z, &z, 0, NULL, NULL));
  }
  CHECK(clSetKernelArg(k[1], 0, sizeof buf, &buf));
  size_t g = 1;
  double* t[2] = {malloc(sizeof(double) * n), malloc(sizeof(double) * n)};
  if (argc > 2 && strcmp(argv[2], "burst") == 0)
    for (int r = 0; r < 30; ++r) {
      for (int i = 0; i < 1000; ++i) CHECK(clEnqueueNDRangeKernel(env.queue, k[1], 1, NULL, &g, NULL, 0, NULL, NULL));
      CHECK(clFinish(env.queue));
    }
  for (int i = 0; i < 100; ++i) for (int w = 0; w < 2; ++w) { CHECK(clEnqueueNDRangeKernel(env.queue, k[w], 1, NULL, &g, NULL, 0, NULL, NULL)); CHECK(clFinish(env.queue)); }
  for (int i = 0; i < n; ++i) for (int w = 0; w < 2; ++w) {
    double t0 = now_us(); CHECK(clEnqueueNDRangeKernel(env.queue, k[w], 1, NULL, &g, NULL, 0, NULL, NULL)); CHECK(clFinish(env.queue)); t[w][i] = now_us() - t0;
  }
  for (int w = 0; w < 2; ++w) { sort_samples(t[w], n); printf("%s: enqueue+finish p50 %.2f p10 %.2f\n", w ? "buffer arg" : "no arg", t[w][n/2], t[w][n/10]); }
  return 0;
}
