/* A program built from a binary: build from source, fetch CL_PROGRAM_BINARIES, create a new
 * program with clCreateProgramWithBinary, build it, run both and compare. */
#include "common.h"

static const char* kSrc =
    "__kernel void poly(__global const int* x, __global int* y) {\n"
    "  size_t i = get_global_id(0);\n"
    "  int v = x[i];\n"
    "  y[i] = 3 * v * v - 2 * v + 11;\n"
    "}\n";

enum { N = 8192 };

static void run(example_env* env, cl_program prog, cl_mem x, cl_mem y, int* out) {
  cl_kernel k = example_kernel(prog, "poly");
  CHECK(clSetKernelArg(k, 0, sizeof x, &x));
  CHECK(clSetKernelArg(k, 1, sizeof y, &y));
  size_t global = N;
  CHECK(clEnqueueNDRangeKernel(env->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env->queue, y, CL_TRUE, 0, N * sizeof(int), out, 0, NULL, NULL));
  CHECK(clReleaseKernel(k));
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  static int x[N], y1[N], y2[N];
  for (int i = 0; i < N; ++i) x[i] = (i % 201) - 100;
  cl_mem dx = example_buffer(&env, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof x, x);
  cl_mem dy = example_buffer(&env, CL_MEM_WRITE_ONLY, sizeof y1, NULL);

  cl_program src = example_build(&env, kSrc, NULL);
  run(&env, src, dx, dy, y1);

  cl_uint ndev = 0;
  CHECK(clGetProgramInfo(src, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL));
  EXPECT(ndev == 1);
  size_t size = 0;
  CHECK(clGetProgramInfo(src, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL));
  printf("binary fetched: %s\n", size > 0 ? "yes" : "no");
  EXPECT(size > 0);
  unsigned char* bin = (unsigned char*)malloc(size);
  unsigned char* bins[1] = {bin};
  CHECK(clGetProgramInfo(src, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL));

  cl_int err, bin_status = -1;
  const unsigned char* cbins[1] = {bin};
  cl_program fromBin = clCreateProgramWithBinary(env.context, 1, &env.device, &size, cbins, &bin_status, &err);
  CHECK_ERR(err, "clCreateProgramWithBinary");
  printf("clCreateProgramWithBinary: binary status %s\n", bin_status == CL_SUCCESS ? "CL_SUCCESS" : "error");
  CHECK(clBuildProgram(fromBin, 1, &env.device, NULL, NULL, NULL));
  cl_build_status bs;
  CHECK(clGetProgramBuildInfo(fromBin, env.device, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
  printf("build from binary: %s\n", bs == CL_BUILD_SUCCESS ? "CL_BUILD_SUCCESS" : "not built");

  /* The rebuilt program's binary round-trips too. */
  size_t size2 = 0;
  CHECK(clGetProgramInfo(fromBin, CL_PROGRAM_BINARY_SIZES, sizeof size2, &size2, NULL));
  printf("rebuilt program has a binary: %s\n", size2 > 0 ? "yes" : "no");

  char names[256] = {0};
  CHECK(clGetProgramInfo(fromBin, CL_PROGRAM_KERNEL_NAMES, sizeof names - 1, names, NULL));
  printf("kernel names: %s\n", names);
  run(&env, fromBin, dx, dy, y2);

  int bad = 0, same = memcmp(y1, y2, sizeof y1) == 0;
  for (int i = 0; i < N; ++i)
    if (y1[i] != 3 * x[i] * x[i] - 2 * x[i] + 11) ++bad;
  printf("source result mismatches=%d, binary result identical: %s checksum=%08x\n", bad,
         same ? "yes" : "no", example_fnv(y2, sizeof y2));

  /* A binary that is not a binary must be refused, not crash. */
  unsigned char junk[64];
  memset(junk, 0xA5, sizeof junk);
  const unsigned char* jb[1] = {junk};
  size_t jsize = sizeof junk;
  cl_int jstatus = CL_SUCCESS;
  cl_program bad_prog = clCreateProgramWithBinary(env.context, 1, &env.device, &jsize, jb, &jstatus, &err);
  cl_int jbuild = err;
  if (err == CL_SUCCESS) jbuild = clBuildProgram(bad_prog, 1, &env.device, NULL, NULL, NULL);
  printf("junk binary refused: %s\n", (err != CL_SUCCESS || jbuild != CL_SUCCESS) ? "yes" : "no");
  if (bad_prog) clReleaseProgram(bad_prog);

  free(bin);
  clReleaseProgram(src);
  clReleaseProgram(fromBin);
  clReleaseMemObject(dx);
  clReleaseMemObject(dy);
  example_release(&env);
  return (!bad && same && bs == CL_BUILD_SUCCESS) ? 0 : 1;
}
