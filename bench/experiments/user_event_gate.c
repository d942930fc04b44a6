// How long a command gated by a user event takes to run once the host sets the event, on the
// native OpenCL (NVIDIA's on the GPU machine). A tandemd holds a queue on a user event for
// every cross-server wait (an imported event) and for every server-to-server copy's
// destination half, so this latency is paid on each step of the 4-server advection.
//   gcc -O2 -I .deps/include -o /tmp/user_event_gate bench/experiments/user_event_gate.c -lOpenCL
//   OCL_ICD_VENDORS=<dir with nvidia.icd> OCL_ICD_FILENAMES=libnvidia-opencl.so.1 /tmp/user_event_gate
// p50 and p90 of R rounds, us, of:
//   plain       a 12 KB device copy, enqueue to clWaitForEvents
//   gated       the same copy with a user event in its wait list: clSetUserEventStatus to the
//               end of clWaitForEvents (the copy enqueued and flushed 200 us before)
//   marker      a marker waiting on the user event, then the copy (in-order queue), same timing
//   set only    clSetUserEventStatus's own time in "gated"
//   cross-queue the copy waiting on a copy of a second queue: enqueue both, wait on the first
//   held dep    a read on a second queue waiting on a copy that a user event holds (the
//               copy enqueued, flushed, 200 us, then the event set): set to the read's end;
//               "held dep, copy" the same to the copy's own end. A tandemd's source half
//               waits so on a kernel that its queue's server-to-server gates hold.
//   callback    the copy with a CL_COMPLETE callback: enqueue to the callback's run (spinning)
//   read pageable / read pinned / write pageable   12 KB to/from malloc'd or mapped
//               CL_MEM_ALLOC_HOST_PTR memory: non-blocking reads then clWaitForEvents, a
//               blocking write (as a tandemd's server-to-server halves do)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "round_trip/timing.h"

enum { R = 300 };
static void report(const char* name, double* v) {
  sort_samples(v, R);
  printf("%-12s p50 %8.1f us  p90 %8.1f us\n", name, v[R / 2], v[R * 9 / 10]);
}
static void spin_us(double us) {
  double t = now_us() + us;
  while (now_us() < t) {
  }
}
#define CK(x)                                                  \
  do {                                                         \
    cl_int e_ = (x);                                           \
    if (e_) {                                                  \
      fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, e_); \
      exit(1);                                                 \
    }                                                          \
  } while (0)
static atomic_int fired;
static double fired_at;
static void CL_CALLBACK on_complete(cl_event ev, cl_int status, void* data) {
  (void)ev, (void)status, (void)data;
  fired_at = now_us();
  atomic_store(&fired, 1);
}
int main(void) {
  cl_platform_id p;
  cl_device_id d;
  cl_int e;
  CK(clGetPlatformIDs(1, &p, NULL));
  CK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
  char name[256];
  CK(clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof name, name, NULL));
  printf("device: %s\n", name);
  cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
  CK(e);
  cl_command_queue q = clCreateCommandQueue(c, d, 0, &e), q2 = clCreateCommandQueue(c, d, 0, &e);
  CK(e);
  const size_t n = 12 << 10;
  cl_mem a = clCreateBuffer(c, CL_MEM_READ_WRITE, n, NULL, &e), b = clCreateBuffer(c, CL_MEM_READ_WRITE, n, NULL, &e),
         x = clCreateBuffer(c, CL_MEM_READ_WRITE, n, NULL, &e);
  CK(e);
  static double t[R], s[R];
  for (int warm = 0; warm < 2; ++warm) {
    for (int r = 0; r < R; ++r) {
      cl_event ev;
      double t0 = now_us();
      CK(clEnqueueCopyBuffer(q, a, b, 0, 0, n, 0, NULL, &ev));
      CK(clWaitForEvents(1, &ev));
      t[r] = now_us() - t0;
      CK(clReleaseEvent(ev));
    }
  }
  report("plain", t);
  for (int r = 0; r < R; ++r) {
    cl_event u = clCreateUserEvent(c, &e), ev;
    CK(e);
    CK(clEnqueueCopyBuffer(q, a, b, 0, 0, n, 1, &u, &ev));
    CK(clFlush(q));
    spin_us(200);
    double t0 = now_us();
    CK(clSetUserEventStatus(u, CL_COMPLETE));
    double t1 = now_us();
    CK(clWaitForEvents(1, &ev));
    t[r] = now_us() - t0;
    s[r] = t1 - t0;
    CK(clReleaseEvent(ev));
    CK(clReleaseEvent(u));
  }
  report("gated", t);
  report("set only", s);
  for (int r = 0; r < R; ++r) {
    cl_event u = clCreateUserEvent(c, &e), ev;
    CK(e);
    CK(clEnqueueMarkerWithWaitList(q, 1, &u, NULL));
    CK(clEnqueueCopyBuffer(q, a, b, 0, 0, n, 0, NULL, &ev));
    CK(clFlush(q));
    spin_us(200);
    double t0 = now_us();
    CK(clSetUserEventStatus(u, CL_COMPLETE));
    CK(clWaitForEvents(1, &ev));
    t[r] = now_us() - t0;
    CK(clReleaseEvent(ev));
    CK(clReleaseEvent(u));
  }
  report("marker", t);
  for (int r = 0; r < R; ++r) {
    cl_event e2, ev;
    double t0 = now_us();
    CK(clEnqueueCopyBuffer(q2, x, a, 0, 0, n, 0, NULL, &e2));
    CK(clFlush(q2));
    CK(clEnqueueCopyBuffer(q, a, b, 0, 0, n, 1, &e2, &ev));
    CK(clWaitForEvents(1, &ev));
    t[r] = now_us() - t0;
    CK(clReleaseEvent(ev));
    CK(clReleaseEvent(e2));
  }
  report("cross-queue", t);
  {
    static double tc[R];
    char* host = malloc(n);
    for (int r = 0; r < R; ++r) {
      cl_event u = clCreateUserEvent(c, &e), ec, er;
      CK(e);
      CK(clEnqueueCopyBuffer(q, x, a, 0, 0, n, 1, &u, &ec));
      CK(clFlush(q));
      CK(clEnqueueReadBuffer(q2, a, CL_FALSE, 0, n, host, 1, &ec, &er));
      CK(clFlush(q2));
      spin_us(200);
      double t0 = now_us();
      CK(clSetUserEventStatus(u, CL_COMPLETE));
      CK(clWaitForEvents(1, &ec));
      tc[r] = now_us() - t0;
      CK(clWaitForEvents(1, &er));
      t[r] = now_us() - t0;
      CK(clReleaseEvent(ec));
      CK(clReleaseEvent(er));
      CK(clReleaseEvent(u));
    }
    report("held dep", t);
    report("held dep, copy", tc);
    free(host);
  }
  for (int r = 0; r < R; ++r) {
    cl_event ev;
    atomic_store(&fired, 0);
    double t0 = now_us();
    CK(clEnqueueCopyBuffer(q, a, b, 0, 0, n, 0, NULL, &ev));
    CK(clSetEventCallback(ev, CL_COMPLETE, on_complete, NULL));
    CK(clFlush(q));
    while (!atomic_load(&fired)) {
    }
    t[r] = fired_at - t0;
    CK(clWaitForEvents(1, &ev));
    CK(clReleaseEvent(ev));
  }
  report("callback", t);
  char* pageable = malloc(n);
  cl_mem pin = clCreateBuffer(c, CL_MEM_ALLOC_HOST_PTR, n, NULL, &e);
  CK(e);
  void* pinned = clEnqueueMapBuffer(q, pin, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, NULL, NULL, &e);
  CK(e);
  for (int which = 0; which < 2; ++which) {
    for (int r = 0; r < R; ++r) {
      cl_event ev;
      double t0 = now_us();
      CK(clEnqueueReadBuffer(q, a, CL_FALSE, 0, n, which ? pinned : pageable, 0, NULL, &ev));
      CK(clWaitForEvents(1, &ev));
      t[r] = now_us() - t0;
      CK(clReleaseEvent(ev));
    }
    report(which ? "read pinned" : "read pageable", t);
  }
  for (int r = 0; r < R; ++r) {
    double t0 = now_us();
    CK(clEnqueueWriteBuffer(q, a, CL_TRUE, 0, n, pageable, 0, NULL, NULL));
    t[r] = now_us() - t0;
  }
  report("write pageable", t);
  return 0;
}
