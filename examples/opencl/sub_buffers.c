/* Sub-buffers: regions at the device's base alignment, kernels and reads on sub-buffers,
 * writes seen through the parent, info queries; bad regions are reported, not compared. */
#include "common.h"

static const char* kSrc =
    "__kernel void tag(__global int* x, const int t) { x[get_global_id(0)] = t * 100000 + (int)get_global_id(0); }\n";

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_uint align_bits = 0;
  CHECK(clGetDeviceInfo(env.device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
  size_t align = align_bits / 8;
  EXPECT(align >= sizeof(int));
  size_t per = align / sizeof(int) * 4; /* ints per sub-buffer: a multiple of the alignment */
  size_t total = per * 3;
  cl_mem parent = example_buffer(&env, CL_MEM_READ_WRITE, total * sizeof(int), NULL);
  int zero = 0;
  CHECK(clEnqueueFillBuffer(env.queue, parent, &zero, sizeof zero, 0, total * sizeof(int), 0, NULL, NULL));

  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "tag");
  cl_int err;
  cl_mem subs[2];
  for (int s = 0; s < 2; ++s) {
    /* Sub-buffers 0 and 2 of three equal parts: the middle one stays untouched. */
    cl_buffer_region r = {(size_t)(2 * s) * per * sizeof(int), per * sizeof(int)};
    subs[s] = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &err);
    CHECK_ERR(err, "clCreateSubBuffer");
    cl_int t = s + 1;
    CHECK(clSetKernelArg(k, 0, sizeof subs[s], &subs[s]));
    CHECK(clSetKernelArg(k, 1, sizeof t, &t));
    size_t global = per;
    CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
  }
  int* out = (int*)malloc(total * sizeof(int));
  CHECK(clEnqueueReadBuffer(env.queue, parent, CL_TRUE, 0, total * sizeof(int), out, 0, NULL, NULL));
  int bad = 0;
  for (size_t i = 0; i < total; ++i) {
    int want = 0;
    if (i < per) want = 100000 + (int)i;
    if (i >= 2 * per) want = 200000 + (int)(i - 2 * per);
    if (out[i] != want) ++bad;
  }
  printf("kernels on sub-buffers 0 and 2, read through parent: mismatches=%d\n", bad);

  /* Write through the parent, read through a sub-buffer at an offset. */
  int v[4] = {11, 22, 33, 44}, back[4];
  CHECK(clEnqueueWriteBuffer(env.queue, parent, CL_TRUE, (2 * per + 8) * sizeof(int), sizeof v, v, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env.queue, subs[1], CL_TRUE, 8 * sizeof(int), sizeof back, back, 0, NULL, NULL));
  int same = memcmp(v, back, sizeof v) == 0;
  printf("write through parent, read through sub-buffer: %s\n", same ? "same" : "DIFFERENT");

  cl_mem assoc = NULL;
  size_t off = 0, size = 0;
  CHECK(clGetMemObjectInfo(subs[1], CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL));
  CHECK(clGetMemObjectInfo(subs[1], CL_MEM_OFFSET, sizeof off, &off, NULL));
  CHECK(clGetMemObjectInfo(subs[1], CL_MEM_SIZE, sizeof size, &size, NULL));
  int info_ok = assoc == parent && off == 2 * per * sizeof(int) && size == per * sizeof(int);
  printf("sub-buffer info (parent, offset, size): %s\n", info_ok ? "ok" : "FAIL");

  cl_buffer_region bad_r = {sizeof(int), sizeof(int) * 4};
  cl_mem mis = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &bad_r, &err);
  /* Informational: the spec wants both refused, but NVIDIA's OpenCL accepts them. */
  printf("# misaligned origin: %d\n", (int)err);
  if (mis) clReleaseMemObject(mis);
  cl_buffer_region out_r = {0, total * sizeof(int) + align};
  cl_mem oob = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &out_r, &err);
  printf("# region beyond the parent: %d\n", (int)err);
  if (oob) clReleaseMemObject(oob);

  printf("checksum=%08x\n", example_fnv(out, total * sizeof(int)) ^ (unsigned)per);
  clReleaseMemObject(subs[0]);
  clReleaseMemObject(subs[1]);
  clReleaseMemObject(parent);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  example_release(&env);
  free(out);
  return (!bad && same && info_ok) ? 0 : 1;
}
