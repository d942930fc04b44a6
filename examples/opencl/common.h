/* Helpers shared by the OpenCL examples. Only <CL/cl.h> and the C library: the examples
 * must stay ordinary OpenCL 1.2 programs that run unchanged natively and through Tandem.
 *
 * Output rules (tests/e2e compares native and Tandem stdout byte for byte):
 *   - deterministic lines only: no timings, addresses, sizes that depend on the device;
 *   - lines starting with '#' are informational (device names...) and the comparer drops them;
 *   - exit 0 on success, 1 on any unexpected result or error (message on stderr). */
#ifndef TANDEM_EXAMPLES_COMMON_H
#define TANDEM_EXAMPLES_COMMON_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Aborts with the failing call, its line and the error code. */
#define CHECK(call)                                                                          \
  do {                                                                                       \
    cl_int check_err_ = (call);                                                              \
    if (check_err_ != CL_SUCCESS) {                                                          \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, (int)check_err_); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

/* For creators that return an object and report through their last argument. */
#define CHECK_ERR(err, what)                                                                 \
  do {                                                                                       \
    if ((err) != CL_SUCCESS) {                                                               \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, what, (int)(err));      \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

/* Fails the program with a message when `cond` is false. */
#define EXPECT(cond)                                                                         \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);                    \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

typedef struct {
  cl_platform_id platform;
  cl_device_id device;
  cl_context context;
  cl_command_queue queue;
} example_env;

static inline char* example_platform_str(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  CHECK(clGetPlatformInfo(p, what, 0, NULL, &n));
  char* s = (char*)calloc(n + 1, 1);
  CHECK(clGetPlatformInfo(p, what, n, s, NULL));
  return s;
}

static inline char* example_device_str(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  CHECK(clGetDeviceInfo(d, what, 0, NULL, &n));
  char* s = (char*)calloc(n + 1, 1);
  CHECK(clGetDeviceInfo(d, what, n, s, NULL));
  return s;
}

/* The first platform with a device, or the one whose name contains
 * $TANDEM_EXAMPLE_PLATFORM, so that the same binary runs natively and through Tandem. */
static inline void example_pick(example_env* env, cl_command_queue_properties qprops) {
  cl_uint np = 0;
  CHECK(clGetPlatformIDs(0, NULL, &np));
  EXPECT(np > 0);
  cl_platform_id* ps = (cl_platform_id*)calloc(np, sizeof *ps);
  CHECK(clGetPlatformIDs(np, ps, NULL));
  const char* want = getenv("TANDEM_EXAMPLE_PLATFORM");
  env->platform = NULL;
  for (cl_uint i = 0; i < np && !env->platform; ++i) {
    if (want && *want) {
      char* name = example_platform_str(ps[i], CL_PLATFORM_NAME);
      int match = strstr(name, want) != NULL;
      free(name);
      if (!match) continue;
    }
    cl_uint nd = 0;
    if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 1, &env->device, &nd) == CL_SUCCESS && nd > 0)
      env->platform = ps[i];
  }
  free(ps);
  if (!env->platform) {
    fprintf(stderr, "no OpenCL platform with a device%s%s\n", want ? " named " : "", want ? want : "");
    exit(1);
  }
  cl_int err;
  cl_context_properties cprops[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)env->platform, 0};
  env->context = clCreateContext(cprops, 1, &env->device, NULL, NULL, &err);
  CHECK_ERR(err, "clCreateContext");
  env->queue = clCreateCommandQueue(env->context, env->device, qprops, &err);
  CHECK_ERR(err, "clCreateCommandQueue");
}

static inline void example_release(example_env* env) {
  CHECK(clFinish(env->queue));
  CHECK(clReleaseCommandQueue(env->queue));
  CHECK(clReleaseContext(env->context));
}

/* Every device of the picked platform in one context, replacing env's one-device context
 * and queue (multi-device programs make a queue per device themselves). Returns the
 * devices (the caller frees them) and their count in *ndev. */
static inline cl_device_id* example_pick_all(example_env* env, cl_uint* ndev) {
  example_pick(env, 0);
  CHECK(clGetDeviceIDs(env->platform, CL_DEVICE_TYPE_ALL, 0, NULL, ndev));
  cl_device_id* devs = (cl_device_id*)calloc(*ndev, sizeof *devs);
  CHECK(clGetDeviceIDs(env->platform, CL_DEVICE_TYPE_ALL, *ndev, devs, NULL));
  CHECK(clReleaseCommandQueue(env->queue));
  CHECK(clReleaseContext(env->context));
  env->queue = NULL;
  cl_int err;
  cl_context_properties cprops[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)env->platform, 0};
  env->context = clCreateContext(cprops, *ndev, devs, NULL, NULL, &err);
  CHECK_ERR(err, "clCreateContext");
  return devs;
}

/* Builds for `ndev` devices of env's context; prints the build log on stderr and fails
 * when the build does. */
static inline cl_program example_build_for(example_env* env, cl_uint ndev, const cl_device_id* devs, const char* src,
                                           const char* options) {
  cl_int err;
  cl_program prog = clCreateProgramWithSource(env->context, 1, &src, NULL, &err);
  CHECK_ERR(err, "clCreateProgramWithSource");
  err = clBuildProgram(prog, ndev, devs, options, NULL, NULL);
  if (err != CL_SUCCESS) {
    size_t n = 0;
    clGetProgramBuildInfo(prog, devs[0], CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char* log = (char*)calloc(n + 1, 1);
    clGetProgramBuildInfo(prog, devs[0], CL_PROGRAM_BUILD_LOG, n, log, NULL);
    fprintf(stderr, "clBuildProgram failed: %d\n%s\n", (int)err, log);
    free(log);
    exit(1);
  }
  return prog;
}

/* Prints the build log on stderr and fails when the build does. */
static inline cl_program example_build(example_env* env, const char* src, const char* options) {
  return example_build_for(env, 1, &env->device, src, options);
}

static inline cl_kernel example_kernel(cl_program prog, const char* name) {
  cl_int err;
  cl_kernel k = clCreateKernel(prog, name, &err);
  CHECK_ERR(err, name);
  return k;
}

static inline cl_mem example_buffer(example_env* env, cl_mem_flags flags, size_t size, void* host) {
  cl_int err;
  cl_mem m = clCreateBuffer(env->context, flags, size, host, &err);
  CHECK_ERR(err, "clCreateBuffer");
  return m;
}

/* A 32-bit FNV-1a digest, printed as a fixed-width hex checksum. */
static inline unsigned example_fnv(const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  unsigned h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

#endif
