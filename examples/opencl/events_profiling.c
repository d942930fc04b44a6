/* Events with profiling: write, kernel and read events on a profiling queue, each checked
 * for queued <= submit <= start <= end, the order between commands of an in-order queue,
 * and their info (type, status, queue, context). Prints only facts, never times. */
#include "common.h"

static const char* kSrc =
    "__kernel void work(__global float* x, const int iters) {\n"
    "  size_t i = get_global_id(0);\n"
    "  float v = x[i];\n"
    "  for (int k = 0; k < iters; ++k) v = v * 0.5f + 1.0f;\n"
    "  x[i] = v;\n"
    "}\n";

static const char* type_name(cl_command_type t) {
  switch (t) {
    case CL_COMMAND_WRITE_BUFFER: return "WRITE_BUFFER";
    case CL_COMMAND_NDRANGE_KERNEL: return "NDRANGE_KERNEL";
    case CL_COMMAND_READ_BUFFER: return "READ_BUFFER";
    default: return "OTHER";
  }
}

int main(void) {
  enum { N = 1 << 16 };
  example_env env;
  example_pick(&env, CL_QUEUE_PROFILING_ENABLE);
  cl_command_queue_properties qp = 0;
  CHECK(clGetCommandQueueInfo(env.queue, CL_QUEUE_PROPERTIES, sizeof qp, &qp, NULL));
  printf("queue profiling enabled: %s\n", (qp & CL_QUEUE_PROFILING_ENABLE) ? "yes" : "no");

  static float x[N];
  for (int i = 0; i < N; ++i) x[i] = (float)(i % 64);
  cl_mem m = example_buffer(&env, CL_MEM_READ_WRITE, sizeof x, NULL);
  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k = example_kernel(prog, "work");
  cl_int iters = 64;
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clSetKernelArg(k, 1, sizeof iters, &iters));

  cl_event ev[3];
  size_t global = N;
  CHECK(clEnqueueWriteBuffer(env.queue, m, CL_FALSE, 0, sizeof x, x, 0, NULL, &ev[0]));
  CHECK(clEnqueueNDRangeKernel(env.queue, k, 1, NULL, &global, NULL, 1, &ev[0], &ev[1]));
  CHECK(clEnqueueReadBuffer(env.queue, m, CL_FALSE, 0, sizeof x, x, 1, &ev[1], &ev[2]));
  CHECK(clWaitForEvents(3, ev));

  int all_ok = 1;
  cl_ulong prev_end = 0;
  for (int i = 0; i < 3; ++i) {
    cl_command_type type;
    cl_int status;
    cl_command_queue q;
    cl_context c;
    CHECK(clGetEventInfo(ev[i], CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
    CHECK(clGetEventInfo(ev[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
    CHECK(clGetEventInfo(ev[i], CL_EVENT_COMMAND_QUEUE, sizeof q, &q, NULL));
    CHECK(clGetEventInfo(ev[i], CL_EVENT_CONTEXT, sizeof c, &c, NULL));
    cl_ulong t[4];
    CHECK(clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_QUEUED, sizeof t[0], &t[0], NULL));
    CHECK(clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_SUBMIT, sizeof t[1], &t[1], NULL));
    CHECK(clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_START, sizeof t[2], &t[2], NULL));
    CHECK(clGetEventProfilingInfo(ev[i], CL_PROFILING_COMMAND_END, sizeof t[3], &t[3], NULL));
    int ordered = t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3];
    int nonzero = t[0] != 0 && t[3] != 0;
    int after_prev = t[2] >= prev_end;  /* in-order queue: starts after the previous ended */
    prev_end = t[3];
    printf("event %d: type=%s status=%s queue=%s context=%s queued<=submit<=start<=end: %s "
           "nonzero: %s starts after previous: %s\n",
           i, type_name(type), status == CL_COMPLETE ? "COMPLETE" : "NOT-COMPLETE",
           q == env.queue ? "ok" : "wrong", c == env.context ? "ok" : "wrong", ordered ? "ok" : "FAIL",
           nonzero ? "ok" : "FAIL", after_prev ? "ok" : "FAIL");
    all_ok &= status == CL_COMPLETE && q == env.queue && c == env.context && ordered && nonzero && after_prev;
  }

  /* An event from a queue without profiling must refuse profiling queries. */
  cl_int err;
  cl_command_queue plain = clCreateCommandQueue(env.context, env.device, 0, &err);
  CHECK_ERR(err, "clCreateCommandQueue(plain)");
  cl_event pe;
  CHECK(clEnqueueNDRangeKernel(plain, k, 1, NULL, &global, NULL, 0, NULL, &pe));
  CHECK(clWaitForEvents(1, &pe));
  cl_ulong tq;
  err = clGetEventProfilingInfo(pe, CL_PROFILING_COMMAND_END, sizeof tq, &tq, NULL);
  printf("profiling info without profiling queue: %s\n",
         err == CL_PROFILING_INFO_NOT_AVAILABLE ? "CL_PROFILING_INFO_NOT_AVAILABLE" : "other");
  all_ok &= err == CL_PROFILING_INFO_NOT_AVAILABLE;

  int bad = 0;
  for (int i = 0; i < N; ++i) {
    float v = (float)(i % 64);
    for (int j = 0; j < iters; ++j) v = v * 0.5f + 1.0f;
    if (x[i] != v) ++bad;
  }
  printf("results: mismatches=%d\n", bad);
  printf("events_profiling: %s\n", all_ok && !bad ? "ok" : "FAIL");
  for (int i = 0; i < 3; ++i) clReleaseEvent(ev[i]);
  clReleaseEvent(pe);
  clReleaseCommandQueue(plain);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseMemObject(m);
  example_release(&env);
  return all_ok && !bad ? 0 : 1;
}
