// Does a command held by an unset user event in one process slow another process's kernels on
// the same GPU? A tandemd holds a queue on a user event for every imported (cross-server)
// event and every server-to-server copy's destination; if the driver submits such a command
// and the GPU's time-slice scheduler keeps that context runnable while it waits, every other
// server on the GPU loses time slices to it.
//   gcc -O2 -I .deps/include -o /tmp/gated_neighbour bench/experiments/gated_neighbour.c -l:libOpenCL.so.1
//   OCL_ICD_VENDORS=<dir with nvidia.icd> OCL_ICD_FILENAMES=libnvidia-opencl.so.1 /tmp/gated_neighbour
// Process A times R launches of a ~100 us kernel (then clFinish), in phases, while process B
// (its own context on the same device):
//   idle      has a context and a queue, nothing enqueued
//   gated     has a copy waiting on an unset user event, and a kernel behind it
//   gated x8  eight such queues
//   released  has set the events and finished
// Prints ms per R launches in each phase (median of 5 repetitions).
#define _DEFAULT_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "round_trip/timing.h"

#define CK(x)                                                             \
  do {                                                                    \
    cl_int e_ = (x);                                                      \
    if (e_) {                                                             \
      fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, e_);    \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static const char* kSrc =
    "__kernel void spin(__global float* a, int iters) {\n"
    "  size_t i = get_global_id(0); float x = a[i];\n"
    "  for (int k = 0; k < iters; ++k) x = x * 0.999f + 0.001f;\n"
    "  a[i] = x;\n"
    "}\n";

typedef struct {
  cl_context c;
  cl_device_id d;
  cl_command_queue q;
  cl_kernel k;
  cl_mem a;
} env;

static void setup(env* e) {
  cl_platform_id p;
  cl_int err;
  CK(clGetPlatformIDs(1, &p, NULL));
  CK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &e->d, NULL));
  e->c = clCreateContext(NULL, 1, &e->d, NULL, NULL, &err);
  CK(err);
  e->q = clCreateCommandQueue(e->c, e->d, 0, &err);
  CK(err);
  cl_program prog = clCreateProgramWithSource(e->c, 1, &kSrc, NULL, &err);
  CK(err);
  CK(clBuildProgram(prog, 1, &e->d, "", NULL, NULL));
  e->k = clCreateKernel(prog, "spin", &err);
  CK(err);
  e->a = clCreateBuffer(e->c, CL_MEM_READ_WRITE, (1 << 20) * sizeof(float), NULL, &err);
  CK(err);
  CK(clSetKernelArg(e->k, 0, sizeof(cl_mem), &e->a));
}

#ifndef ITERS
#define ITERS 2000
#endif
enum { R = 200, REPS = 5 };

static double burst(env* e, int iters) {
  size_t g = 1 << 20;
  CK(clSetKernelArg(e->k, 1, sizeof iters, &iters));
  double t0 = now_us();
  for (int r = 0; r < R; ++r) CK(clEnqueueNDRangeKernel(e->q, e->k, 1, NULL, &g, NULL, 0, NULL, NULL));
  CK(clFinish(e->q));
  return (now_us() - t0) / 1e3;
}

static double phase(env* e, int iters) {
  double v[REPS];
  for (int i = 0; i < REPS; ++i) v[i] = burst(e, iters);
  sort_samples(v, REPS);
  return v[REPS / 2];
}

int main(void) {
  int to_b[2], to_a[2];
  if (pipe(to_b) || pipe(to_a)) return 1;
  pid_t pid = fork();
  if (pid == 0) {  // B
    env e;
    setup(&e);
    char c;
    cl_int err;
    cl_command_queue qs[8];
    cl_event us[8];
    for (int i = 0; i < 8; ++i) {
      qs[i] = clCreateCommandQueue(e.c, e.d, 0, &err);
      CK(err);
      us[i] = clCreateUserEvent(e.c, &err);
      CK(err);
    }
    int iters = 10;
    CK(clSetKernelArg(e.k, 1, sizeof iters, &iters));
    size_t g = 1 << 20;
    cl_mem b = clCreateBuffer(e.c, CL_MEM_READ_WRITE, 4096, NULL, &err);
    CK(err);
    if (write(to_a[1], "i", 1) != 1 || read(to_b[0], &c, 1) != 1) return 1;  // idle measured
    for (int i = 0; i < 8; ++i) {
      if (i == 1) {
        if (write(to_a[1], "g", 1) != 1 || read(to_b[0], &c, 1) != 1) return 1;  // gated x1 measured
      }
      CK(clEnqueueCopyBuffer(qs[i], e.a, b, 0, 0, 4096, 1, &us[i], NULL));
      CK(clEnqueueNDRangeKernel(qs[i], e.k, 1, NULL, &g, NULL, 0, NULL, NULL));
      CK(clFlush(qs[i]));
    }
    if (write(to_a[1], "8", 1) != 1 || read(to_b[0], &c, 1) != 1) return 1;  // gated x8 measured
    for (int i = 0; i < 8; ++i) CK(clSetUserEventStatus(us[i], CL_COMPLETE));
    for (int i = 0; i < 8; ++i) CK(clFinish(qs[i]));
    if (write(to_a[1], "r", 1) != 1 || read(to_b[0], &c, 1) != 1) return 1;  // released measured
    return 0;
  }
  env e;
  setup(&e);
  char c;
  const int iters = ITERS;
  burst(&e, iters);  // warm
  const char* names[] = {"idle", "gated", "gated x8", "released"};
  for (int ph = 0; ph < 4; ++ph) {
    if (read(to_a[0], &c, 1) != 1) return 1;
    double ms = phase(&e, iters);
    printf("%-9s %8.2f ms per %d kernels\n", names[ph], ms, R);
    if (write(to_b[1], "x", 1) != 1) return 1;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
