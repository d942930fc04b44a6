/* opencl_bench: the OpenCL counterpart of cuda_bench, an ordinary OpenCL program with
 * nothing Tandem-specific. It uses the first platform that has a device (through Tandem,
 * Tandem's ICD is the only one visible). Output: `name value unit` per line, fixed names,
 * or `name n/a reason` for one that cannot be taken here; notes go to stderr.
 * TANDEM_BENCH_QUICK=1: few repetitions, sizes up to 1 MiB.
 *   opencl_bench          enqueue cost, copy latency, bandwidth, idle read-back
 *   opencl_bench --idle   only the warm and idle read-backs (run again with keepalive off)
 *   opencl_bench --no-idle  everything but the idle read-backs
 *   opencl_bench --idle-keepalive  the idle read-backs with a keepalive inside the program:
 *                         a thread of its own that, every TANDEM_KEEPALIVE_MS (default 2),
 *                         writes 8 B, runs an empty kernel and reads 8 B back on a queue of
 *                         its own, as tandemd's does (natively only: what a keepalive can do
 *                         with no network in the path)
 *   opencl_bench --s2s    only device 0 -> device 1 copies in one context of both:
 *                         clEnqueueCopyBuffer on device 1's queue of a buffer last written
 *                         on device 0's, against a relay through the host (needs two
 *                         devices, else n/a rows)
 * Every OpenCL call of the first two modes is checked and any error exits 1; in --s2s mode
 * an error becomes an n/a row with its reason. Host memory is ordinary (pageable)
 * memory: OpenCL has no portable pinned-allocation call, so there is no pinned variant. */
#define CL_TARGET_OPENCL_VERSION 120
#define _POSIX_C_SOURCE 200809L
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(call)                                                                           \
  do {                                                                                     \
    cl_int err_ = (call);                                                                  \
    if (err_ != CL_SUCCESS) {                                                              \
      fprintf(stderr, "opencl_bench: %s:%d: %s: error %d\n", __FILE__, __LINE__, #call, err_); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static int quick;
static cl_context ctx;
static cl_command_queue queue;
static cl_kernel kernel;
static cl_mem dev_buf;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print(const char* name, double value, const char* unit) {
  printf("%s %.4f %s\n", name, value, unit);
  fflush(stdout);
}

static int reps(int full, int q) { return quick ? q : full; }

static double* samples(int n) {
  double* v = malloc(sizeof(double) * (size_t)n);
  if (!v) {
    fprintf(stderr, "opencl_bench: out of memory\n");
    exit(1);
  }
  return v;
}

static void enqueue_empty(void) {
  size_t global = 1;
  CK(clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, NULL, 0, NULL, NULL));
}

static void sleep_ms(double ms) {
  struct timespec ts;
  ts.tv_sec = (time_t)(ms / 1000);
  ts.tv_nsec = (long)((ms - ts.tv_sec * 1000.0) * 1e6);
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* N enqueues then one clFinish, divided by N. */
static void enqueue_cost(void) {
  int n = reps(1000, 20), r, nr = reps(30, 3), i;
  double* per = samples(nr);
  for (r = 0; r < nr; ++r) {
    double t0 = now_us();
    for (i = 0; i < n; ++i) enqueue_empty();
    CK(clFinish(queue));
    per[r] = (now_us() - t0) / n;
  }
  print("ocl_enqueue_async", median(per, nr), "us");
  free(per);
}

static void enqueue_finish(void) {
  int r, nr = reps(2000, 20);
  double* t = samples(nr);
  for (r = 0; r < nr; ++r) {
    double t0 = now_us();
    enqueue_empty();
    CK(clFinish(queue));
    t[r] = now_us() - t0;
  }
  print("ocl_enqueue_finish", median(t, nr), "us");
  free(t);
}

static void copy(int write, void* host, size_t bytes) {
  if (write) CK(clEnqueueWriteBuffer(queue, dev_buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
  else CK(clEnqueueReadBuffer(queue, dev_buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
}

static void copy_latency(const char* label, size_t bytes) {
  char host[4096], name[64];
  int write, r, nr = reps(2000, 20);
  double* t = samples(nr);
  memset(host, 1, sizeof host);
  for (write = 1; write >= 0; --write) {
    for (r = 0; r < nr; ++r) {
      double t0 = now_us();
      copy(write, host, bytes);
      t[r] = now_us() - t0;
    }
    snprintf(name, sizeof name, "ocl_%s_%s", write ? "write" : "read", label);
    print(name, median(t, nr), "us");
  }
  free(t);
}

static void bandwidth(const char* label, size_t bytes, int nr) {
  char name[64];
  int write, r;
  double* gbs = samples(nr);
  char* host = malloc(bytes);
  if (!host) {
    fprintf(stderr, "opencl_bench: out of memory\n");
    exit(1);
  }
  memset(host, 1, bytes);
  for (write = 1; write >= 0; --write) {
    copy(write, host, bytes); /* unmeasured: first-touch costs */
    for (r = 0; r < nr; ++r) {
      double t0 = now_us();
      copy(write, host, bytes);
      gbs[r] = bytes / ((now_us() - t0) * 1e3);
    }
    snprintf(name, sizeof name, "ocl_bw_%s_pageable_%s", write ? "write" : "read", label);
    print(name, median(gbs, nr), "GB/s");
  }
  free(host);
  free(gbs);
}

static void idle_readback(void) {
  static const double gap_ms[] = {0.1, 1, 5, 20, 100};
  static const char* gap_label[] = {"0.1ms", "1ms", "5ms", "20ms", "100ms"};
  static const int gap_reps[] = {50, 50, 40, 30, 20}; /* p50 of 20-50 samples, ~4 s */
  int v = 0, g, r, nr = reps(500, 10);
  char name[64];
  double* t = samples(nr > 50 ? nr : 50);
  for (r = 0; r < nr; ++r) {
    double t0 = now_us();
    copy(0, &v, sizeof v);
    t[r] = now_us() - t0;
  }
  print("ocl_readback_warm", median(t, nr), "us");
  for (g = 0; g < 5; ++g) {
    nr = reps(gap_reps[g], 3);
    for (r = 0; r < nr; ++r) {
      double t0;
      sleep_ms(gap_ms[g]);
      t0 = now_us();
      copy(0, &v, sizeof v);
      t[r] = now_us() - t0;
    }
    snprintf(name, sizeof name, "ocl_readback_idle_%s", gap_label[g]);
    print(name, median(t, nr), "us");
  }
  free(t);
}

/* --idle-keepalive: tandemd's keepalive (server/backends/opencl/opencl_warm.cc), in the
 * program, on the program's context and device. */
static struct {
  cl_command_queue queue;
  cl_kernel kernel;
  cl_mem scratch;
  double period_ms;
  int stop; /* under mu: set by the main thread after the read-backs */
  pthread_mutex_t mu;
  unsigned long rounds;
  pthread_t thread;
} ka = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void* keepalive_loop(void* arg) {
  char host[8] = {0x5a};
  size_t global = 1;
  (void)arg;
  for (;;) {
    int stop;
    sleep_ms(ka.period_ms);
    pthread_mutex_lock(&ka.mu);
    stop = ka.stop;
    pthread_mutex_unlock(&ka.mu);
    if (stop) return NULL;
    CK(clEnqueueWriteBuffer(ka.queue, ka.scratch, CL_FALSE, 0, sizeof host, host, 0, NULL, NULL));
    CK(clEnqueueNDRangeKernel(ka.queue, ka.kernel, 1, NULL, &global, NULL, 0, NULL, NULL));
    CK(clEnqueueReadBuffer(ka.queue, ka.scratch, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
    ++ka.rounds;
  }
}

static void keepalive_start(cl_device_id device, cl_program prog) {
  const char* v = getenv("TANDEM_KEEPALIVE_MS");
  cl_int err;
  ka.period_ms = v && *v ? atof(v) : 2;
  ka.queue = clCreateCommandQueue(ctx, device, 0, &err);
  CK(err);
  ka.scratch = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
  CK(err);
  ka.kernel = clCreateKernel(prog, "empty", &err); /* its own: arguments are per kernel object */
  CK(err);
  CK(clSetKernelArg(ka.kernel, 0, sizeof ka.scratch, &ka.scratch));
  if (pthread_create(&ka.thread, NULL, keepalive_loop, NULL) != 0) {
    fprintf(stderr, "opencl_bench: cannot start the keepalive thread\n");
    exit(1);
  }
}

static void keepalive_stop(void) {
  pthread_mutex_lock(&ka.mu);
  ka.stop = 1;
  pthread_mutex_unlock(&ka.mu);
  pthread_join(ka.thread, NULL);
  fprintf(stderr, "opencl_bench: %lu in-process keepalive rounds\n", ka.rounds);
  CK(clReleaseKernel(ka.kernel));
  CK(clReleaseMemObject(ka.scratch));
  CK(clReleaseCommandQueue(ka.queue));
}

/* --s2s: an error is the reason for the n/a rows. */
static char why[256];
static const char* err_name(cl_int e) {
  switch (e) {
    case CL_OUT_OF_RESOURCES: return " CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return " CL_OUT_OF_HOST_MEMORY";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return " CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_INVALID_VALUE: return " CL_INVALID_VALUE";
    case CL_INVALID_DEVICE: return " CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return " CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return " CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return " CL_INVALID_MEM_OBJECT";
    case CL_INVALID_OPERATION: return " CL_INVALID_OPERATION";
    case CL_INVALID_BUFFER_SIZE: return " CL_INVALID_BUFFER_SIZE";
    default: return "";
  }
}
#define SOFT(call)                                                                  \
  do {                                                                              \
    cl_int e_ = (call);                                                             \
    if (e_ != CL_SUCCESS) {                                                         \
      snprintf(why, sizeof why, "%s: error %d%s", #call, e_, err_name(e_));         \
      return -1;                                                                    \
    }                                                                               \
  } while (0)
#define SOFT_ERR(what)                                                              \
  do {                                                                              \
    if (err != CL_SUCCESS) {                                                        \
      snprintf(why, sizeof why, "%s: error %d%s", what, err, err_name(err));        \
      return -1;                                                                    \
    }                                                                               \
  } while (0)

/* Device 0 -> device 1 in one context: the copy (through Tandem a server-to-server copy)
 * against a read to the host on queue 0 and a write from it on queue 1. Returns 0, or -1
 * with `why` set; `done` counts the rows printed. */
static int peer_copy(cl_platform_id platform, size_t bytes, const char* label, int nr, int* done) {
  cl_device_id devs[2];
  cl_uint nd = 0;
  cl_int err;
  cl_context c;
  cl_command_queue q0, q1;
  cl_mem a, b;
  cl_ulong max_alloc[2] = {0, 0};
  char name[64];
  unsigned char probe[2] = {0, 0}, mark[4096];
  unsigned char* host;
  double* gbs = samples(nr);
  int r;

  SOFT(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 2, devs, &nd));
  if (nd < 2) {
    snprintf(why, sizeof why, "%u device(s)", nd);
    return -1;
  }
  SOFT(clGetDeviceInfo(devs[0], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc[0], &max_alloc[0], NULL));
  SOFT(clGetDeviceInfo(devs[1], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc[1], &max_alloc[1], NULL));
  if (bytes > max_alloc[0] || bytes > max_alloc[1]) {
    snprintf(why, sizeof why, "max allocation %llu B", (unsigned long long)(max_alloc[0] < max_alloc[1] ? max_alloc[0] : max_alloc[1]));
    return -1;
  }
  host = malloc(bytes);
  if (!host) {
    snprintf(why, sizeof why, "out of host memory");
    return -1;
  }
  memset(host, 0x5a, bytes);
  memset(mark, 0x5a, sizeof mark);
  c = clCreateContext(NULL, 2, devs, NULL, NULL, &err);
  SOFT_ERR("clCreateContext(2 devices)");
  q0 = clCreateCommandQueue(c, devs[0], 0, &err);
  SOFT_ERR("clCreateCommandQueue(device 0)");
  q1 = clCreateCommandQueue(c, devs[1], 0, &err);
  SOFT_ERR("clCreateCommandQueue(device 1)");
  a = clCreateBuffer(c, CL_MEM_READ_WRITE, bytes, NULL, &err);
  SOFT_ERR("clCreateBuffer");
  b = clCreateBuffer(c, CL_MEM_READ_WRITE, bytes, NULL, &err);
  SOFT_ERR("clCreateBuffer");
  /* a is written on device 0, b is used on device 1. */
  SOFT(clEnqueueWriteBuffer(q0, a, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
  memset(host, 0, bytes);
  SOFT(clEnqueueWriteBuffer(q1, b, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
  SOFT(clFinish(q0));
  SOFT(clFinish(q1));

  snprintf(name, sizeof name, "ocl_s2s_copy_%s", label);
  for (r = 0; r <= nr; ++r) { /* the first is unmeasured */
    double t0;
    /* A small write on queue 0 first, so that a's newest contents are on device 0. */
    SOFT(clEnqueueWriteBuffer(q0, a, CL_TRUE, 0, sizeof mark, mark, 0, NULL, NULL));
    SOFT(clFinish(q0));
    t0 = now_us();
    SOFT(clEnqueueCopyBuffer(q1, a, b, 0, 0, bytes, 0, NULL, NULL));
    SOFT(clFinish(q1));
    if (r > 0) gbs[r - 1] = bytes / ((now_us() - t0) * 1e3);
  }
  SOFT(clEnqueueReadBuffer(q1, b, CL_TRUE, 0, 1, &probe[0], 0, NULL, NULL));
  SOFT(clEnqueueReadBuffer(q1, b, CL_TRUE, bytes - 1, 1, &probe[1], 0, NULL, NULL));
  if (probe[0] != 0x5a || probe[1] != 0x5a) {
    snprintf(why, sizeof why, "clEnqueueCopyBuffer: wrong data on device 1");
    return -1;
  }
  print(name, median(gbs, nr), "GB/s");
  ++*done;

  snprintf(name, sizeof name, "ocl_relay_copy_%s", label);
  for (r = 0; r <= nr; ++r) {
    double t0 = now_us();
    SOFT(clEnqueueReadBuffer(q0, a, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
    SOFT(clEnqueueWriteBuffer(q1, b, CL_TRUE, 0, bytes, host, 0, NULL, NULL));
    if (r > 0) gbs[r - 1] = bytes / ((now_us() - t0) * 1e3);
  }
  print(name, median(gbs, nr), "GB/s");
  ++*done;

  SOFT(clReleaseMemObject(a));
  SOFT(clReleaseMemObject(b));
  SOFT(clReleaseCommandQueue(q0));
  SOFT(clReleaseCommandQueue(q1));
  SOFT(clReleaseContext(c));
  free(host);
  free(gbs);
  return 0;
}

static int peer_main(cl_platform_id platform) {
  const char* label = quick ? "1MiB" : "256MiB";
  int done = 0;
  if (peer_copy(platform, quick ? (1u << 20) : (256u << 20), label, reps(5, 3), &done) != 0) {
    fprintf(stderr, "opencl_bench --s2s: %s\n", why);
    if (done < 1) printf("ocl_s2s_copy_%s n/a %s\n", label, why);
    if (done < 2) printf("ocl_relay_copy_%s n/a %s\n", label, why);
  }
  return 0;
}

int main(int argc, char** argv) {
  static const char* src = "__kernel void empty(__global int* p) {}\n";
  const char* q = getenv("TANDEM_BENCH_QUICK");
  cl_platform_id platforms[16], platform = NULL;
  cl_device_id device = NULL;
  cl_uint np = 0, i, nd;
  cl_int err;
  cl_ulong max_alloc = 0;
  char pname[256] = "", dname[256] = "";
  size_t max_bytes;
  cl_program prog;
  int s;
  static const size_t sizes[] = {1u << 20, 64u << 20, 256u << 20};
  static const char* size_label[] = {"1MiB", "64MiB", "256MiB"};
  static const int size_reps[] = {100, 10, 5};

  const char* mode = argc > 1 ? argv[1] : "";
  int keepalive = strcmp(mode, "--idle-keepalive") == 0;
  int idle_only = keepalive || strcmp(mode, "--idle") == 0, s2s = strcmp(mode, "--s2s") == 0;
  int no_idle = strcmp(mode, "--no-idle") == 0;

  if (argc > 2 || (*mode && !idle_only && !s2s && !no_idle)) {
    fprintf(stderr, "usage: opencl_bench [--idle | --idle-keepalive | --no-idle | --s2s]\n");
    return 2;
  }
  quick = q && *q && strcmp(q, "0") != 0;
  CK(clGetPlatformIDs(16, platforms, &np));
  for (i = 0; i < np && i < 16 && !platform; ++i) {
    nd = 0;
    err = clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_ALL, 1, &device, &nd);
    if (err == CL_SUCCESS && nd > 0) platform = platforms[i];
    else if (err != CL_DEVICE_NOT_FOUND) CK(err);
  }
  if (!platform) {
    fprintf(stderr, "opencl_bench: no OpenCL platform with a device (%u platforms)\n", np);
    return 1;
  }
  CK(clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof pname, pname, NULL));
  CK(clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof dname, dname, NULL));
  CK(clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL));
  fprintf(stderr, "opencl_bench: platform %s, device %s%s\n", pname, dname, quick ? " (quick mode)" : "");
  if (s2s) return peer_main(platform);

  ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  CK(err);
  queue = clCreateCommandQueue(ctx, device, 0, &err);
  CK(err);
  prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  CK(err);
  err = clBuildProgram(prog, 1, &device, "", NULL, NULL);
  if (err != CL_SUCCESS) {
    char log[4096] = "";
    clGetProgramBuildInfo(prog, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    fprintf(stderr, "opencl_bench: build failed (%d): %s\n", err, log);
    return 1;
  }
  kernel = clCreateKernel(prog, "empty", &err);
  CK(err);

  max_bytes = idle_only ? 4096 : quick ? (1u << 20) : (256u << 20);
  while (max_bytes > max_alloc && max_bytes > (1u << 20)) max_bytes /= 4;
  if (max_bytes < (256u << 20) && !quick && !idle_only)
    fprintf(stderr, "opencl_bench: max allocation %llu B: larger sizes skipped\n", (unsigned long long)max_alloc);
  dev_buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, max_bytes, NULL, &err);
  CK(err);
  CK(clSetKernelArg(kernel, 0, sizeof dev_buf, &dev_buf));
  {
    /* Warm-up: the first enqueue compiles/uploads; the first copy allocates. */
    int k, z = 0;
    for (k = 0; k < 100; ++k) enqueue_empty();
    copy(1, &z, sizeof z);
    CK(clFinish(queue));
  }

  if (!idle_only) {
    enqueue_cost();
    enqueue_finish();
    copy_latency("8B", 8);
    copy_latency("4KB", 4096);
    for (s = 0; s < 3; ++s)
      if (sizes[s] <= max_bytes) bandwidth(size_label[s], sizes[s], reps(size_reps[s], 3));
  }
  if (keepalive) keepalive_start(device, prog);
  if (!no_idle) idle_readback();
  if (keepalive) keepalive_stop();

  CK(clReleaseMemObject(dev_buf));
  CK(clReleaseKernel(kernel));
  CK(clReleaseProgram(prog));
  CK(clReleaseCommandQueue(queue));
  CK(clReleaseContext(ctx));
  return 0;
}
