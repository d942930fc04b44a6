/* NDRange shapes: a global offset with a NULL local size in 1, 2 and 3 dimensions, and a
 * global size that is not a multiple of any usual work-group size. */
#include "common.h"

static const char* kSrc =
    "__kernel void ids(__global int* out, const int w, const int h) {\n"
    "  int x = get_global_id(0) - get_global_offset(0);\n"
    "  int y = get_global_id(1) - get_global_offset(1);\n"
    "  int z = get_global_id(2) - get_global_offset(2);\n"
    "  int idx = (z * h + y) * w + x;\n"
    "  out[idx] = (int)(get_global_id(0) * 1000000 + get_global_id(1) * 1000 + get_global_id(2));\n"
    "}\n";

static int run(example_env* env, cl_kernel k, cl_uint dims, const size_t* off, const size_t* gsz) {
  size_t w = gsz[0], h = dims > 1 ? gsz[1] : 1, d = dims > 2 ? gsz[2] : 1, n = w * h * d;
  int* out = (int*)malloc(n * sizeof(int));
  cl_mem m = example_buffer(env, CL_MEM_WRITE_ONLY, n * sizeof(int), NULL);
  cl_int wi = (cl_int)w, hi = (cl_int)h;
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clSetKernelArg(k, 1, sizeof wi, &wi));
  CHECK(clSetKernelArg(k, 2, sizeof hi, &hi));
  CHECK(clEnqueueNDRangeKernel(env->queue, k, dims, off, gsz, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env->queue, m, CL_TRUE, 0, n * sizeof(int), out, 0, NULL, NULL));
  int bad = 0;
  for (size_t z = 0; z < d; ++z)
    for (size_t y = 0; y < h; ++y)
      for (size_t x = 0; x < w; ++x) {
        size_t gx = x + off[0], gy = y + (dims > 1 ? off[1] : 0), gz = z + (dims > 2 ? off[2] : 0);
        if (out[(z * h + y) * w + x] != (int)(gx * 1000000 + gy * 1000 + gz)) ++bad;
      }
  printf("%uD offset=(%zu,%zu,%zu) global=(%zu,%zu,%zu) local=NULL: items=%zu mismatches=%d checksum=%08x\n",
         dims, off[0], dims > 1 ? off[1] : 0, dims > 2 ? off[2] : 0, w, h, d, n, bad,
         example_fnv(out, n * sizeof(int)));
  clReleaseMemObject(m);
  free(out);
  return bad;
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "ids");
  int bad = 0;
  size_t o1[3] = {100, 0, 0}, g1[3] = {1000, 1, 1};
  size_t o2[3] = {7, 300, 0}, g2[3] = {37, 53, 1};
  size_t o3[3] = {3, 5, 11}, g3[3] = {9, 13, 17};
  size_t o0[3] = {0, 0, 0}, g0[3] = {997, 1, 1}; /* a prime size: no local size divides it but 1 */
  bad += run(&env, k, 1, o1, g1);
  bad += run(&env, k, 2, o2, g2);
  bad += run(&env, k, 3, o3, g3);
  bad += run(&env, k, 1, o0, g0);
  printf("ndrange_offset: %s\n", bad ? "FAIL" : "ok");
  clReleaseKernel(k);
  clReleaseProgram(prog);
  example_release(&env);
  return bad ? 1 : 0;
}
