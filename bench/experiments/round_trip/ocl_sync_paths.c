/* ocl_sync_paths [N]: an empty kernel's enqueue and wait, N times per way of waiting, natively,
 * to choose how tandemd waits for an OpenCL synchronize. Prints each way's p50/p10/p90 (us).
 *   one-finish     enqueue, clFinish on the same thread (what a program does)
 *   one-poll       enqueue with an event, clFlush, poll the event's status on the same thread
 *   one-wait       enqueue with an event, clFlush, clWaitForEvents on the same thread
 *   two-finish     enqueue, clFlush, clFinish on a second, spinning thread (tandemd,
 *                  unless the wait runs next)
 *   two-noflush    enqueue, clFinish on the second thread (tandemd when the wait runs next)
 *   two-poll       enqueue with an event, clFlush, the second thread polls the event
 * and for an 8-byte read back into mapped host memory (tandemd's read slots):
 *   read-one       a blocking read on the same thread
 *   read-two       a non-blocking read with an event, clFlush, clWaitForEvents on the second thread
 *   read-noflush   the same without the clFlush (clWaitForEvents flushes)
 * Set-up and error checks are the OpenCL examples' (examples/opencl/common.h). */
#include <pthread.h>
#include <stdatomic.h>

#include "../../../examples/opencl/common.h"
#include "timing.h"

enum { kFinish = 1, kPoll = 2, kWait = 3 };
static example_env env;
static cl_kernel kernel;
static _Atomic int job;        /* 0 none, else kFinish / kPoll, set by the main thread */
static _Atomic int done;       /* set by the helper when the wait is over */
static cl_event job_event;

static void poll_event(cl_event e) {
  cl_int st = CL_QUEUED;
  do CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  while (st > CL_COMPLETE);
  EXPECT(st == CL_COMPLETE);
}

static void* helper(void* arg) {
  (void)arg;
  for (;;) {
    int j;
    while ((j = atomic_load(&job)) == 0) sched_yield();
    if (j < 0) return NULL;
    if (j == kFinish) CHECK(clFinish(env.queue));
    else if (j == kWait) CHECK(clWaitForEvents(1, &job_event));
    else poll_event(job_event);
    atomic_store(&job, 0);
    atomic_store(&done, 1);
  }
}

static void hand_over(int j) {
  atomic_store(&done, 0);
  atomic_store(&job, j);
  while (!atomic_load(&done)) sched_yield();
}

static cl_mem device_buf;
static unsigned char* slot;  /* mapped host memory */

static double run(const char* way, int n) {
  size_t g = 1;
  double* t = malloc(sizeof(double) * (size_t)n);
  EXPECT(t != NULL);
  for (int i = 0; i < n; ++i) {
    cl_event e = NULL;
    const int read = strncmp(way, "read-", 5) == 0;
    const int wants_event = strstr(way, "poll") || strstr(way, "wait") || (read && strcmp(way, "read-one") != 0);
    double t0 = now_us();
    if (read)
      CHECK(clEnqueueReadBuffer(env.queue, device_buf, strcmp(way, "read-one") == 0, 0, 8, slot, 0, NULL,
                                wants_event ? &e : NULL));
    else
      CHECK(clEnqueueNDRangeKernel(env.queue, kernel, 1, NULL, &g, NULL, 0, NULL, wants_event ? &e : NULL));
    if (read) {
      if (strcmp(way, "read-two") == 0) CHECK(clFlush(env.queue));
      if (e) {
        job_event = e;
        hand_over(kWait);
      }
    } else if (strcmp(way, "one-finish") == 0) {
      CHECK(clFinish(env.queue));
    } else if (strcmp(way, "one-poll") == 0) {
      CHECK(clFlush(env.queue));
      poll_event(e);
    } else if (strcmp(way, "one-wait") == 0) {
      CHECK(clFlush(env.queue));
      CHECK(clWaitForEvents(1, &e));
    } else if (strcmp(way, "two-finish") == 0) {
      CHECK(clFlush(env.queue));
      hand_over(kFinish);
    } else if (strcmp(way, "two-noflush") == 0) {
      hand_over(kFinish);
    } else if (strcmp(way, "two-poll") == 0) {
      CHECK(clFlush(env.queue));
      job_event = e;
      hand_over(kPoll);
    }
    t[i] = now_us() - t0;
    if (e) clReleaseEvent(e);
  }
  sort_samples(t, n);
  printf("%-12s p50 %6.1f us  p10 %6.1f  p90 %6.1f\n", way, t[n / 2], t[n / 10], t[9 * n / 10]);
  double p50 = t[n / 2];
  free(t);
  return p50;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 3000;
  const int rounds = argc > 2 ? atoi(argv[2]) : 2;
  EXPECT(n > 10 && rounds > 0);
  example_pick(&env, 0);
  cl_program prog = example_build(&env, "__kernel void empty(__global int* p) { if (p) p[0] = 0; }", NULL);
  kernel = example_kernel(prog, "empty");
  cl_mem none = NULL;
  CHECK(clSetKernelArg(kernel, 0, sizeof none, &none));
  cl_int err = CL_SUCCESS;
  device_buf = clCreateBuffer(env.context, CL_MEM_READ_WRITE, 8, NULL, &err);
  CHECK_ERR(err, "clCreateBuffer");
  cl_mem host_buf = clCreateBuffer(env.context, CL_MEM_ALLOC_HOST_PTR, 4096, NULL, &err);
  CHECK_ERR(err, "clCreateBuffer(CL_MEM_ALLOC_HOST_PTR)");
  slot = clEnqueueMapBuffer(env.queue, host_buf, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, 4096, 0, NULL, NULL, &err);
  CHECK_ERR(err, "clEnqueueMapBuffer");
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, helper, NULL) == 0);
  static const char* ways[] = {"one-finish", "one-poll",    "one-wait", "two-finish",  "two-noflush",
                               "two-poll",   "read-one",    "read-two", "read-noflush"};
  for (int r = 0; r < rounds; ++r)
    for (size_t w = 0; w < sizeof ways / sizeof *ways; ++w) run(ways[w], n);
  atomic_store(&job, -1);
  pthread_join(th, NULL);
  CHECK(clEnqueueUnmapMemObject(env.queue, host_buf, slot, 0, NULL, NULL));
  CHECK(clFinish(env.queue));
  clReleaseMemObject(host_buf);
  clReleaseMemObject(device_buf);
  clReleaseKernel(kernel);
  clReleaseProgram(prog);
  example_release(&env);
  return 0;
}
