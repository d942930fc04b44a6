/* Map/unmap: read and write maps on ALLOC_HOST_PTR and USE_HOST_PTR buffers, blocking and
 * not, WRITE_INVALIDATE_REGION, and a partial map at an offset. */
#include "common.h"

static const char* kSrc =
    "__kernel void scale(__global int* x, const int f, const int add) {\n"
    "  size_t i = get_global_id(0);\n"
    "  x[i] = x[i] * f + add;\n"
    "}\n";

enum { N = 4096 };

static void run_scale(example_env* env, cl_kernel k, cl_mem m, int f, int add) {
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clSetKernelArg(k, 1, sizeof f, &f));
  CHECK(clSetKernelArg(k, 2, sizeof add, &add));
  size_t global = N;
  CHECK(clEnqueueNDRangeKernel(env->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL));
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "scale");
  cl_int err;

  /* 1. ALLOC_HOST_PTR: fill through a write map, kernel, check through a read map. */
  cl_mem a = example_buffer(&env, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, N * sizeof(int), NULL);
  int* p = (int*)clEnqueueMapBuffer(env.queue, a, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                    N * sizeof(int), 0, NULL, NULL, &err);
  CHECK_ERR(err, "clEnqueueMapBuffer(write)");
  for (int i = 0; i < N; ++i) p[i] = i;
  CHECK(clEnqueueUnmapMemObject(env.queue, a, p, 0, NULL, NULL));
  run_scale(&env, k, a, 3, 1);
  cl_event mapped;
  p = (int*)clEnqueueMapBuffer(env.queue, a, CL_FALSE, CL_MAP_READ, 0, N * sizeof(int), 0, NULL,
                               &mapped, &err);
  CHECK_ERR(err, "clEnqueueMapBuffer(read)");
  CHECK(clWaitForEvents(1, &mapped));
  int bad = 0;
  long long sum = 0;
  for (int i = 0; i < N; ++i) {
    if (p[i] != 3 * i + 1) ++bad;
    sum += p[i];
  }
  CHECK(clEnqueueUnmapMemObject(env.queue, a, p, 0, NULL, NULL));
  CHECK(clReleaseEvent(mapped));
  printf("alloc_host_ptr: write map, kernel, read map: mismatches=%d sum=%lld\n", bad, sum);

  /* 2. A partial read/write map at an offset: change a window, check the whole buffer. */
  size_t off = 1024, len = 512;
  p = (int*)clEnqueueMapBuffer(env.queue, a, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, off * sizeof(int),
                               len * sizeof(int), 0, NULL, NULL, &err);
  CHECK_ERR(err, "clEnqueueMapBuffer(window)");
  int window_ok = p[0] == 3 * (int)off + 1;
  for (size_t i = 0; i < len; ++i) p[i] = -(int)(off + i);
  CHECK(clEnqueueUnmapMemObject(env.queue, a, p, 0, NULL, NULL));
  int* back = (int*)malloc(N * sizeof(int));
  CHECK(clEnqueueReadBuffer(env.queue, a, CL_TRUE, 0, N * sizeof(int), back, 0, NULL, NULL));
  int bad2 = 0;
  for (int i = 0; i < N; ++i) {
    int want = (i >= (int)off && i < (int)(off + len)) ? -i : 3 * i + 1;
    if (back[i] != want) ++bad2;
  }
  printf("partial map: offset=%zu len=%zu first_ok=%d mismatches=%d\n", off, len, window_ok, bad2);

  /* 3. USE_HOST_PTR: the host array is the buffer's storage; after a map it holds the data. */
  int* host = (int*)malloc(N * sizeof(int));
  for (int i = 0; i < N; ++i) host[i] = 2 * i;
  cl_mem u = example_buffer(&env, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, N * sizeof(int), host);
  run_scale(&env, k, u, 5, -7);
  p = (int*)clEnqueueMapBuffer(env.queue, u, CL_TRUE, CL_MAP_READ, 0, N * sizeof(int), 0, NULL, NULL, &err);
  CHECK_ERR(err, "clEnqueueMapBuffer(use_host_ptr)");
  int bad3 = 0, bad_host = 0;
  for (int i = 0; i < N; ++i) {
    if (p[i] != 10 * i - 7) ++bad3;
    if (host[i] != 10 * i - 7) ++bad_host;
  }
  CHECK(clEnqueueUnmapMemObject(env.queue, u, p, 0, NULL, NULL));
  printf("use_host_ptr: read map mismatches=%d host array mismatches=%d\n", bad3, bad_host);

  /* 4. USE_HOST_PTR written through a write map, then read with clEnqueueReadBuffer. */
  p = (int*)clEnqueueMapBuffer(env.queue, u, CL_TRUE, CL_MAP_WRITE, 0, N * sizeof(int), 0, NULL, NULL, &err);
  CHECK_ERR(err, "clEnqueueMapBuffer(use_host_ptr write)");
  for (int i = 0; i < N; ++i) p[i] = i ^ 0x55;
  CHECK(clEnqueueUnmapMemObject(env.queue, u, p, 0, NULL, NULL));
  run_scale(&env, k, u, 1, 1);
  CHECK(clEnqueueReadBuffer(env.queue, u, CL_TRUE, 0, N * sizeof(int), back, 0, NULL, NULL));
  int bad4 = 0;
  for (int i = 0; i < N; ++i)
    if (back[i] != (i ^ 0x55) + 1) ++bad4;
  printf("use_host_ptr: write map, kernel, read mismatches=%d checksum=%08x\n", bad4,
         example_fnv(back, N * sizeof(int)));

  CHECK(clFinish(env.queue));
  clReleaseMemObject(a);
  clReleaseMemObject(u);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  example_release(&env);
  free(back);
  free(host);
  return (bad || bad2 || bad3 || bad_host || bad4 || !window_ok) ? 1 : 0;
}
