/* failed_wait_list: what the machine's OpenCL does with a command enqueued after an event of
 * its wait list has already failed, against one enqueued before the failure. Two cases: the
 * event is a user event set to -42, or a marker that failed because of one. Prints each
 * dependent command's status 0.5 s later (negative: failed with its dependency; 3,
 * CL_QUEUED: it never runs nor ends, as PoCL 3.1 and 5.0 leave it), or the error its enqueue
 * returns (NVIDIA's OpenCL refuses it with the failed event's status), and whether a marker
 * waiting on the user event has failed by the time clSetUserEventStatus returns. Behind OpenCLBackend::Prepare's
 * check of the wait list (bench/results/2026-11-24-h100-g.md).
 *   gcc -I.deps/include -o /tmp/fwl bench/experiments/failed_wait_list.c -lOpenCL && /tmp/fwl */
#include <unistd.h>

#include "../../examples/opencl/common.h"

static cl_int status_of(cl_event e) {
  cl_int st = 0;
  CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  return st;
}

/* A marker on `q` that waits on `dep`, enqueued before or after `user` is set to -42. */
static void run(example_env* env, cl_command_queue q, int through_marker, int before) {
  cl_int err = CL_SUCCESS;
  cl_event user = clCreateUserEvent(env->context, &err);
  CHECK_ERR(err, "clCreateUserEvent");
  cl_event dep = user, first = NULL, dependent = NULL;
  if (through_marker) {
    CHECK(clEnqueueMarkerWithWaitList(env->queue, 1, &user, &first));
    CHECK(clFlush(env->queue));
    dep = first;
  }
  if (!before) {
    CHECK(clSetUserEventStatus(user, -42));
    /* Whether the failure reached the marker within that call: then a lock around the call
     * keeps the marker's failure out of a window too. */
    if (through_marker)
      printf("%-28s right after clSetUserEventStatus returned: the marker's status %d\n", "the marker waiting on it",
             status_of(first));
    usleep(200000);
  }
  const char* what = through_marker ? "after a marker that failed" : "after a failed user event";
  err = clEnqueueMarkerWithWaitList(q, 1, &dep, &dependent);
  if (err != CL_SUCCESS) {  /* NVIDIA's answer when the failure came first */
    printf("%-28s enqueued after  the failure: the enqueue returns %d\n", what, err);
  } else {
    CHECK(clFlush(q));
    if (before) CHECK(clSetUserEventStatus(user, -42));
    usleep(500000);
    printf("%-28s enqueued %s the failure: status %d\n", what, before ? "before" : "after ", status_of(dependent));
    clReleaseEvent(dependent);
  }
  if (first) clReleaseEvent(first);
  clReleaseEvent(user);
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_int err = CL_SUCCESS;
  cl_command_queue other = clCreateCommandQueue(env.context, env.device, 0, &err);
  CHECK_ERR(err, "clCreateCommandQueue");
  for (int through_marker = 0; through_marker < 2; ++through_marker)
    for (int before = 1; before >= 0; --before) run(&env, other, through_marker, before);
  /* A command stuck on a failed event keeps its queue from finishing: leave without it. */
  fflush(stdout);
  _exit(0);
}
