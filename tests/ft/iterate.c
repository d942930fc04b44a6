/* A long iterative OpenCL program for the fault-tolerance tests: the state lives on the
 * device across hundreds of rounds; each round runs a kernel and reads a small window back,
 * and every 25 rounds it prints a checksum. Exact integer arithmetic, so the output is the
 * same bytes on every correct run. An ordinary OpenCL 1.2 program: nothing Tandem-specific.
 * With --bulk-every K, every K-th round also overwrites half of the state from the host
 * and reads the whole state back (transfers large enough to go by RMA through Tandem).
 *   iterate [--rounds N] [--n ELEMENTS] [--sleep-ms MS] [--bulk-every K] */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                          \
  do {                                                                    \
    cl_int e_ = (x);                                                      \
    if (e_ != CL_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, e_); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static const char* kSource =
    "__kernel void advance(__global const uint* in, __global uint* out, uint n, uint round) {\n"
    "  uint i = get_global_id(0);\n"
    "  uint a = in[i], b = in[(i + 1) % n], c = in[(i + n - 1) % n];\n"
    "  uint x = a * 1664525u + (b ^ (c >> 3)) + round * 2654435761u;\n"
    "  out[i] = x ^ (x >> 15);\n"
    "}\n";

static uint64_t Fnv(const uint32_t* v, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= v[i];
    h *= 1099511628211ull;
  }
  return h;
}

int main(int argc, char** argv) {
  int rounds = 300, sleep_ms = 0, bulk_every = 0;
  size_t n = 1 << 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--n")) n = (size_t)atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--sleep-ms")) sleep_ms = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--bulk-every")) bulk_every = atoi(argv[i + 1]);
  }
  if (n < 1024) {
    fprintf(stderr, "iterate: --n must be at least 1024\n");
    return 2;
  }
  cl_uint np = 0;
  CHECK(clGetPlatformIDs(0, NULL, &np));
  cl_platform_id* ps = malloc(np * sizeof *ps);
  CHECK(clGetPlatformIDs(np, ps, NULL));
  cl_device_id dev = NULL;
  for (cl_uint p = 0; p < np && !dev; ++p)
    if (clGetDeviceIDs(ps[p], CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) dev = NULL;
  if (!dev) {
    fprintf(stderr, "no OpenCL device\n");
    return 1;
  }
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CHECK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
  CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &kSource, NULL, &err);
  CHECK(err);
  CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
  cl_kernel k = clCreateKernel(prog, "advance", &err);
  CHECK(err);

  uint32_t* host = malloc(n * sizeof *host);
  uint32_t* update = malloc(n / 2 * sizeof *update);
  for (size_t i = 0; i < n; ++i) host[i] = (uint32_t)(i * 2654435761u + 12345u);
  cl_mem buf[2];
  buf[0] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * 4, host, &err);
  CHECK(err);
  buf[1] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * 4, NULL, &err);
  CHECK(err);
  const cl_uint un = (cl_uint)n;
  uint32_t window[256];
  uint64_t running = 0;
  for (int r = 0; r < rounds; ++r) {
    cl_uint ur = (cl_uint)r;
    CHECK(clSetKernelArg(k, 0, sizeof(cl_mem), &buf[r % 2]));
    CHECK(clSetKernelArg(k, 1, sizeof(cl_mem), &buf[(r + 1) % 2]));
    CHECK(clSetKernelArg(k, 2, sizeof un, &un));
    CHECK(clSetKernelArg(k, 3, sizeof ur, &ur));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
    /* A small read back of a window that moves with the round. */
    size_t at = ((size_t)r * 997u) % (n - 256);
    CHECK(clEnqueueReadBuffer(q, buf[(r + 1) % 2], CL_TRUE, at * 4, sizeof window, window, 0, NULL, NULL));
    running = running * 31 + Fnv(window, 256);
    if (bulk_every > 0 && (r + 1) % bulk_every == 0) {
      /* Half of the next round's input from the host (the rest stays the device's), then
       * the whole of it back. */
      size_t half = n / 2, from = ((size_t)r * 7919u) % (n - half);
      for (size_t i = 0; i < half; ++i) update[i] = (uint32_t)((i + from) * 40503u ^ (uint32_t)r);
      CHECK(clEnqueueWriteBuffer(q, buf[(r + 1) % 2], CL_FALSE, from * 4, half * 4, update, 0, NULL, NULL));
      CHECK(clEnqueueReadBuffer(q, buf[(r + 1) % 2], CL_TRUE, 0, n * 4, host, 0, NULL, NULL));
      running = running * 31 + Fnv(host, n);
    }
    if ((r + 1) % 25 == 0) printf("round %d: window %016llx\n", r + 1, (unsigned long long)running);
    fflush(stdout);
    if (sleep_ms) {
      struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  CHECK(clEnqueueReadBuffer(q, buf[rounds % 2], CL_TRUE, 0, n * 4, host, 0, NULL, NULL));
  printf("final: %016llx\n", (unsigned long long)Fnv(host, n));
  clReleaseMemObject(buf[0]);
  clReleaseMemObject(buf[1]);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  free(host);
  free(update);
  free(ps);
  return 0;
}
