/* ocl_loop idle|launch [N]: N synchronous OpenCL round trips on one queue, clFinish alone or an
 * empty kernel's enqueue and clFinish (the benchmark's ocl_enqueue_finish); prints the p50. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}
#define CK(call)                                                     \
  do {                                                               \
    cl_int e_ = (call);                                              \
    if (e_ != CL_SUCCESS) {                                          \
      fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #call, e_); \
      exit(1);                                                       \
    }                                                                \
  } while (0)

int main(int argc, char** argv) {
  const int launch = argc > 1 && strcmp(argv[1], "launch") == 0;
  const int n = argc > 2 ? atoi(argv[2]) : 3000;
  cl_platform_id p;
  cl_device_id d;
  cl_int e;
  CK(clGetPlatformIDs(1, &p, NULL));
  CK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
  cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
  CK(e);
  cl_command_queue q = clCreateCommandQueueWithProperties(c, d, NULL, &e);
  CK(e);
  const char* src = "__kernel void empty(void) {}";
  cl_program pr = clCreateProgramWithSource(c, 1, &src, NULL, &e);
  CK(e);
  CK(clBuildProgram(pr, 1, &d, "", NULL, NULL));
  cl_kernel k = clCreateKernel(pr, "empty", &e);
  CK(e);
  size_t g = 1;
  double* t = malloc(sizeof(double) * (size_t)n);
  for (int i = 0; i < n; ++i) {
    double t0 = now_us();
    if (launch) CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    CK(clFinish(q));
    t[i] = now_us() - t0;
  }
  qsort(t, (size_t)n, sizeof(double), cmp);
  printf("%s: p50 %.1f us p10 %.1f p90 %.1f\n", launch ? "launch" : "idle", t[n / 2], t[n / 10], t[9 * n / 10]);
  return 0;
}
