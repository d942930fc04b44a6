/* Markers and barriers: clEnqueueMarkerWithWaitList / clEnqueueBarrierWithWaitList (with and
 * without wait lists), the 1.1 clEnqueueMarker / clEnqueueBarrier (clEnqueueWaitForEvents is
 * left out: PoCL does not implement it), and the ordering they give across two queues of one context. */
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#include "common.h"

static const char* kSrc =
    "__kernel void affine(__global int* x, const int mul, const int add) {\n"
    "  size_t i = get_global_id(0);\n"
    "  x[i] = x[i] * mul + add;\n"
    "}\n";

enum { N = 2048 };

static void step(cl_command_queue q, cl_kernel k, cl_mem m, int mul, int add, cl_uint nw, const cl_event* w,
                 cl_event* e) {
  CHECK(clSetKernelArg(k, 0, sizeof m, &m));
  CHECK(clSetKernelArg(k, 1, sizeof mul, &mul));
  CHECK(clSetKernelArg(k, 2, sizeof add, &add));
  size_t global = N;
  CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, nw, w, e));
}

static const char* status_name(cl_event e) {
  cl_int st;
  CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  return st == CL_COMPLETE ? "CL_COMPLETE" : "not complete";
}

static const char* type_name(cl_event e) {
  cl_command_type t;
  CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_TYPE, sizeof t, &t, NULL));
  return t == CL_COMMAND_MARKER ? "CL_COMMAND_MARKER" : (t == CL_COMMAND_BARRIER ? "CL_COMMAND_BARRIER" : "other");
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  cl_int err;
  cl_command_queue q2 = clCreateCommandQueue(env.context, env.device, 0, &err);
  CHECK_ERR(err, "clCreateCommandQueue(q2)");
  cl_program prog = example_build(&env, kSrc, NULL);
  cl_kernel k1 = example_kernel(prog, "affine");
  cl_kernel k2 = example_kernel(prog, "affine");
  int host[N], out[N];
  for (int i = 0; i < N; ++i) host[i] = i;
  cl_mem a = example_buffer(&env, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host);
  cl_mem b = example_buffer(&env, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host);

  /* Queue 1: two steps on a, then a marker that stands for both. */
  cl_event s1, s2, marker;
  step(env.queue, k1, a, 2, 1, 0, NULL, &s1);
  step(env.queue, k1, a, 3, 0, 0, NULL, &s2);
  CHECK(clEnqueueMarkerWithWaitList(env.queue, 0, NULL, &marker));
  /* Queue 2: waits for queue 1's marker through a barrier with a wait list, then copies a into b. */
  cl_event barrier, copied;
  CHECK(clEnqueueBarrierWithWaitList(q2, 1, &marker, &barrier));
  CHECK(clEnqueueCopyBuffer(q2, a, b, 0, 0, sizeof host, 0, NULL, &copied));
  CHECK(clFlush(env.queue));
  CHECK(clFinish(q2));
  CHECK(clEnqueueReadBuffer(q2, b, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  int bad = 0;
  for (int i = 0; i < N; ++i)
    if (out[i] != (2 * i + 1) * 3) ++bad;
  /* The barrier's command type is informational: NVIDIA does not report CL_COMMAND_BARRIER. */
  printf("marker: %s %s; barrier: %s; cross-queue order mismatches=%d\n", type_name(marker), status_name(marker),
         status_name(barrier), bad);
  printf("# barrier event type: %s\n", type_name(barrier));

  /* A marker with a wait list completes only after those events. */
  cl_event s3, m2;
  step(q2, k2, b, 1, 5, 0, NULL, &s3);
  CHECK(clEnqueueMarkerWithWaitList(env.queue, 1, &s3, &m2));
  CHECK(clWaitForEvents(1, &m2));
  printf("marker with wait list: %s, its event: %s\n", status_name(m2), status_name(s3));

  /* OpenCL 1.1 forms. */
  cl_event m3;
  step(env.queue, k1, a, 1, -1, 0, NULL, NULL);
  CHECK(clEnqueueMarker(env.queue, &m3));
  CHECK(clEnqueueBarrier(env.queue));
  CHECK(clEnqueueBarrierWithWaitList(q2, 1, &m3, NULL));
  step(q2, k2, a, 1, 100, 0, NULL, NULL);
  CHECK(clFinish(q2));
  CHECK(clFinish(env.queue));
  CHECK(clEnqueueReadBuffer(env.queue, a, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  int bad2 = 0;
  for (int i = 0; i < N; ++i)
    if (out[i] != (2 * i + 1) * 3 - 1 + 100) ++bad2;
  printf("1.1 marker/barrier, then a cross-queue wait: %s mismatches=%d checksum=%08x\n", type_name(m3), bad2,
         example_fnv(out, sizeof out));

  cl_event evs[] = {s1, s2, marker, barrier, copied, s3, m2, m3};
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; ++i) clReleaseEvent(evs[i]);
  clReleaseMemObject(a);
  clReleaseMemObject(b);
  clReleaseKernel(k1);
  clReleaseKernel(k2);
  clReleaseProgram(prog);
  clReleaseCommandQueue(q2);
  example_release(&env);
  return (bad || bad2) ? 1 : 0;
}
