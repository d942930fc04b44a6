/* examples/opencl/advection split over P separate processes, natively: what four programs
 * sharing one GPU can do without Tandem, against which the 4-server Tandem run compares.
 *
 * examples/opencl/advection with --devices 4 puts four queues in ONE process and context (the
 * issue's "single-process native multi-queue version"); through Tandem the same program's
 * four devices are four tandemd processes, each with its own context on the GPU. This
 * program (the benchmark's "4 processes" baseline) runs the same bands, kernel
 * (advection_kernel.h) and step order in P processes (fork before any OpenCL call), each
 * with its own context on device b % ndev, and exchanges
 * the halo rows through the host as an MPI+OpenCL code does without GPU-aware MPI: after its
 * kernel, process b reads its first and last HALO rows (blocking) into shared memory, all
 * meet at a spinning barrier, and each writes its neighbours' rows into its halo rows before
 * its next kernel (in-order queue). Edge slots alternate by step parity, so one barrier a step
 * suffices. It prints the same checksum line as advection (bit-identical field: the same
 * float operations) and "time: X s for S steps (Y ms/step)" between the start barrier and the
 * barrier after every process's clFinish.
 * Built as BUILD/bench/advection_procs; bench/run_bench.sh runs it beside the 4-device rows.
 * --queues 3 spreads each process's commands over three in-order queues as a tandemd does
 * (kernels on one, the edge reads on a second after the kernel's event, the halo writes on a
 * third, the next kernel after their events), to see what extra queues cost on a shared GPU.
 *   advection_procs [--n N] [--steps S] [--procs P] [--queues 1|3] */
#define _DEFAULT_SOURCE /* clock_gettime, MAP_ANONYMOUS */
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "advection_kernel.h"
#include "common.h"

typedef struct {
  atomic_int arrived;
  atomic_int generation;
  atomic_int failed;
  double elapsed;
} shared_ctl;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sense-counting barrier of P processes; spins with sched_yield (as MPI barriers poll). */
static void barrier(shared_ctl* c, int P) {
  int gen = atomic_load(&c->generation);
  if (atomic_fetch_add(&c->arrived, 1) + 1 == P) {
    atomic_store(&c->arrived, 0);
    atomic_fetch_add(&c->generation, 1);
    return;
  }
  while (atomic_load(&c->generation) == gen) {
    if (atomic_load(&c->failed)) exit(1);
    sched_yield();
  }
}

/* edges: [band][parity][top|bottom][HALO rows of n floats] */
static float* edge(float* edges, int n, int b, int parity, int bottom) {
  return edges + ((((size_t)b * 2 + parity) * 2 + bottom) * HALO) * n;
}

static int g_queues = 1;

static int run_band(int b, int P, int n, int steps, const float* init, float* result, float* edges,
                    shared_ctl* ctl) {
  const double w = 1.0 / n;
  const float ca = (float)cos(w), sa = (float)sin(w);
  example_env env;
  cl_uint ndev = 0;
  cl_device_id* devs = example_pick_all(&env, &ndev);
  cl_device_id dev = devs[b % ndev];
  cl_int err;
  cl_program prog = example_build_for(&env, 1, &dev, kSrc, "-cl-std=CL1.2");
  cl_command_queue q = clCreateCommandQueue(env.context, dev, 0, &err), qr = q, qw = q;
  CHECK_ERR(err, "clCreateCommandQueue");
  if (g_queues == 3) {
    qr = clCreateCommandQueue(env.context, dev, 0, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
    qw = clCreateCommandQueue(env.context, dev, 0, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
  }
  cl_event kev = NULL, wev[2] = {NULL, NULL};
  cl_kernel k = example_kernel(prog, "advect");
  int r0 = (int)((long)n * b / P), rows = (int)((long)n * (b + 1) / P) - r0;
  int up = (b + P - 1) % P, down = (b + 1) % P;
  size_t row_bytes = (size_t)n * sizeof(float), bytes = (size_t)(rows + 2 * HALO) * row_bytes;
  float* band = (float*)malloc(bytes);
  for (int lr = 0; lr < rows + 2 * HALO; ++lr) {
    int gy = ((r0 + lr - HALO) % n + n) % n;
    memcpy(band + (size_t)lr * n, init + (size_t)gy * n, row_bytes);
  }
  cl_mem buf[2];
  for (int p = 0; p < 2; ++p) buf[p] = example_buffer(&env, CL_MEM_READ_WRITE, bytes, NULL);
  CHECK(clEnqueueWriteBuffer(q, buf[0], CL_TRUE, 0, bytes, band, 0, NULL, NULL));
  CHECK(clFinish(q));
  free(band);

  barrier(ctl, P);
  double t0 = now_s();
  cl_int nn = n, crows = rows, start = r0;
  for (int s = 0; s < steps; ++s) {
    int in = s & 1, out = in ^ 1, par = s & 1;
    CHECK(clSetKernelArg(k, 0, sizeof(cl_mem), &buf[in]));
    CHECK(clSetKernelArg(k, 1, sizeof(cl_mem), &buf[out]));
    CHECK(clSetKernelArg(k, 2, sizeof nn, &nn));
    CHECK(clSetKernelArg(k, 3, sizeof crows, &crows));
    CHECK(clSetKernelArg(k, 4, sizeof start, &start));
    CHECK(clSetKernelArg(k, 5, sizeof ca, &ca));
    CHECK(clSetKernelArg(k, 6, sizeof sa, &sa));
    size_t global[2] = {((size_t)n + 15) / 16 * 16, ((size_t)rows + 3) / 4 * 4}, local[2] = {16, 4};
    const int split = qw != q && wev[0];
    CHECK(clEnqueueNDRangeKernel(q, k, 2, NULL, global, local, split ? 2 : 0, split ? wev : NULL, &kev));
    if (split) {
      CHECK(clReleaseEvent(wev[0]));
      CHECK(clReleaseEvent(wev[1]));
      wev[0] = wev[1] = NULL;
    }
    CHECK(clFlush(q));
    /* This band's first and last HALO rows, for the neighbours. */
    CHECK(clEnqueueReadBuffer(qr, buf[out], CL_FALSE, HALO * row_bytes, HALO * row_bytes, edge(edges, n, b, par, 0),
                              1, &kev, NULL));
    CHECK(clEnqueueReadBuffer(qr, buf[out], CL_TRUE, (size_t)rows * row_bytes, HALO * row_bytes,
                              edge(edges, n, b, par, 1), 1, &kev, NULL));
    CHECK(clReleaseEvent(kev));
    barrier(ctl, P);
    /* The halo rows: above, the last rows of band up; below, the first rows of band down. */
    CHECK(clEnqueueWriteBuffer(qw, buf[out], CL_FALSE, 0, HALO * row_bytes, edge(edges, n, up, par, 1), 0, NULL,
                               qw != q ? &wev[0] : NULL));
    CHECK(clEnqueueWriteBuffer(qw, buf[out], CL_FALSE, (size_t)(HALO + rows) * row_bytes, HALO * row_bytes,
                               edge(edges, n, down, par, 0), 0, NULL, qw != q ? &wev[1] : NULL));
    CHECK(clFlush(qw));
  }
  CHECK(clFinish(qw));
  CHECK(clFinish(q));
  if (wev[0]) {
    CHECK(clReleaseEvent(wev[0]));
    CHECK(clReleaseEvent(wev[1]));
  }
  barrier(ctl, P);
  if (b == 0) ctl->elapsed = now_s() - t0;
  CHECK(clEnqueueReadBuffer(q, buf[steps & 1], CL_TRUE, HALO * row_bytes, (size_t)rows * row_bytes,
                            result + (size_t)r0 * n, 0, NULL, NULL));
  CHECK(clReleaseMemObject(buf[0]));
  CHECK(clReleaseMemObject(buf[1]));
  CHECK(clReleaseKernel(k));
  if (qr != q) CHECK(clReleaseCommandQueue(qr));
  if (qw != q) CHECK(clReleaseCommandQueue(qw));
  CHECK(clReleaseCommandQueue(q));
  CHECK(clReleaseProgram(prog));
  CHECK(clReleaseContext(env.context));
  free(devs);
  return 0;
}

static void* shared_alloc(size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return p;
}

int main(int argc, char** argv) {
  int n = 1024, steps = 200, P = 4;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--procs") && i + 1 < argc) P = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--queues") && i + 1 < argc) g_queues = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-check")) continue; /* advection's; only mass is checked here */
    else {
      fprintf(stderr, "usage: %s [--n N] [--steps S] [--procs P] [--queues 1|3]\n", argv[0]);
      return 2;
    }
  }
  if (n < 8 || steps < 0 || P < 1 || n / P < HALO || (g_queues != 1 && g_queues != 3)) {
    fprintf(stderr, "advection_procs: need n >= 8, steps >= 0, 1 <= procs <= n/%d, queues 1 or 3\n", HALO);
    return 2;
  }
  size_t cells = (size_t)n * n;
  float* init = (float*)malloc(cells * sizeof(float));
  advection_init(init, n);
  float* result = (float*)shared_alloc(cells * sizeof(float));
  float* edges = (float*)shared_alloc((size_t)P * 2 * 2 * HALO * n * sizeof(float));
  shared_ctl* ctl = (shared_ctl*)shared_alloc(sizeof *ctl);
  pid_t* pids = (pid_t*)calloc(P, sizeof *pids);
  for (int b = 0; b < P; ++b) {
    pids[b] = fork();
    if (pids[b] < 0) {
      perror("fork");
      atomic_store(&ctl->failed, 1);
      break;
    }
    if (pids[b] == 0) _exit(run_band(b, P, n, steps, init, result, edges, ctl));
  }
  int failed = 0, live = 0;
  for (int b = 0; b < P; ++b) live += pids[b] > 0;
  for (; live > 0; --live) {  /* in any order: a failed band ends the others' barrier waits */
    int st = 0;
    pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0) break;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "advection_procs: a band's process (pid %d) failed (status %d)\n", (int)pid, st);
      atomic_store(&ctl->failed, 1);
      failed = 1;
    }
  }
  failed |= atomic_load(&ctl->failed);
  if (failed) return 1;
  double mass0 = 0, mass = 0, vmin = result[0], vmax = result[0];
  for (size_t i = 0; i < cells; ++i) {
    mass0 += init[i];
    mass += result[i];
    if (result[i] < vmin) vmin = result[i];
    if (result[i] > vmax) vmax = result[i];
  }
  printf("advection: checksum sum=%.6e min=%.6e max=%.6e\n", mass, vmin, vmax);
  if (!(fabs(mass - mass0) / fabs(mass0) < 1e-3)) {
    printf("check: FAILED mass drift (mass0 %.6e)\n", mass0);
    failed = 1;
  }
  printf("time: %.6f s for %d steps (%.3f ms/step), %d process(es)\n", ctl->elapsed, steps,
         steps ? 1e3 * ctl->elapsed / steps : 0.0, P);
  return failed;
}
