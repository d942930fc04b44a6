/* 2-D semi-Lagrangian advection of a scalar on a periodic N×N grid, split over D devices as
 * horizontal bands with halo rows exchanged between the devices' buffers every step.
 *
 * Scheme: solid-body rotation about the grid's centre, u = -w(y - N/2), v = w(x - N/2) (in
 * cells per step, w = 1/N, so the largest displacement, at a corner, is 0.71 cell). Each
 * cell's value is the field at its departure point (the arrival point rotated back by w
 * about the centre, which keeps areas exactly), interpolated by cubic
 * Lagrange polynomials over the 4×4 surrounding cells. Columns wrap; rows come from the
 * band's own buffer, which holds HALO = 3 rows of each neighbouring band above and below
 * (the stencil reaches at most 2 rows beyond a band: displacement < 1, stencil -1..+2).
 *
 * Devices: all devices of the first platform that has one, in ONE context; D in-order
 * queues, queue b on device b % ndev (so on one device this is the single-process
 * multi-queue version). Band b's two buffers (ping-pong) are used only by queue b: after
 * its kernel, queue b copies its halo rows out of the neighbours' new buffers with
 * clEnqueueCopyBuffer, waiting on the events of the neighbours' kernels. That also orders
 * the next step's writes after the neighbours' earlier copies (in-order queues).
 *
 * Self-checks: mass (sum of the field) drifts < 1e-3 relative; with --check (default on
 * for N <= 256) the final field matches a single-array CPU run of the same scheme within
 * 1e-5 of the field's maximum. Every cell is computed by the same arithmetic whatever D is,
 * so the printed checksum is the same for any number of devices; timings and device names
 * are on lines that start with "time:" (tests drop them).
 *
 * Usage: advection [--n N] [--steps S] [--devices D] [--check | --no-check] */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <time.h>

#include "advection_kernel.h"
#include "common.h"

/* The same scheme on one periodic array (the reference). Same float operations, same order. */
static void cpu_weights(float t, float* w) {
  w[0] = -t * (t - 1.0f) * (t - 2.0f) / 6.0f;
  w[1] = (t + 1.0f) * (t - 1.0f) * (t - 2.0f) / 2.0f;
  w[2] = -(t + 1.0f) * t * (t - 2.0f) / 2.0f;
  w[3] = (t + 1.0f) * t * (t - 1.0f) / 6.0f;
}

static void cpu_step(const float* in, float* out, int n, float ca, float sa) {
  float c = 0.5f * (float)n;
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) {
      float xd = c + ca * ((float)x - c) + sa * ((float)y - c);
      float yd = c - sa * ((float)x - c) + ca * ((float)y - c);
      float fx = floorf(xd), fy = floorf(yd), wx[4], wy[4];
      cpu_weights(xd - fx, wx);
      cpu_weights(yd - fy, wy);
      int ix = (int)fx, iy = (int)fy;
      float acc = 0.0f;
      for (int j = 0; j < 4; ++j) {
        const float* row = in + (size_t)((((iy - 1 + j) % n) + n) % n) * n;
        float s = 0.0f;
        for (int i = 0; i < 4; ++i) s += wx[i] * row[((ix - 1 + i) % n + n) % n];
        acc += wy[j] * s;
      }
      out[(size_t)y * n + x] = acc;
    }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double field_sum(const float* f, size_t count) {
  double s = 0;
  for (size_t i = 0; i < count; ++i) s += f[i];
  return s;
}

int main(int argc, char** argv) {
  int n = 1024, steps = 200, D = 4, check = -1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--devices") && i + 1 < argc) D = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--check")) check = 1;
    else if (!strcmp(argv[i], "--no-check")) check = 0;
    else {
      fprintf(stderr, "usage: %s [--n N] [--steps S] [--devices D] [--check | --no-check]\n", argv[0]);
      return 2;
    }
  }
  if (check < 0) check = n <= 256;
  if (n < 8 || steps < 0 || D < 1 || n / D < HALO) {
    fprintf(stderr, "advection: need n >= 8, steps >= 0, 1 <= devices <= n/%d\n", HALO);
    return 2;
  }
  /* Rotation by w = 1/N radians a step; departure points by the exact inverse rotation
   * (area-preserving: x - u dt with u at the arrival point would scale areas by 1 + w^2). */
  const double w = 1.0 / n;
  const float ca = (float)cos(w), sa = (float)sin(w);

  /* The platform and all its devices, in one context; D queues round-robin on them. */
  example_env env;
  cl_uint ndev = 0;
  cl_device_id* devs = example_pick_all(&env, &ndev);
  cl_int err;
  cl_program prog = example_build_for(&env, ndev, devs, kSrc, "-cl-std=CL1.2");
  char* pname = example_platform_str(env.platform, CL_PLATFORM_NAME);
  printf("time: platform %s, %u device(s), %d queue(s)\n", pname, ndev, D);
  free(pname);

  /* The initial field (advection_kernel.h). */
  size_t cells = (size_t)n * n;
  float* init = (float*)malloc(cells * sizeof(float));
  float* result = (float*)malloc(cells * sizeof(float));
  advection_init(init, n);

  cl_command_queue* q = (cl_command_queue*)calloc(D, sizeof *q);
  cl_kernel* k = (cl_kernel*)calloc(D, sizeof *k);
  cl_mem(*buf)[2] = calloc(D, sizeof *buf);
  int* r0 = (int*)calloc(D + 1, sizeof(int));
  for (int b = 0; b <= D; ++b) r0[b] = (int)((long)n * b / D);
  for (int b = 0; b < D; ++b) {
    cl_device_id dev = devs[b % ndev];
    q[b] = clCreateCommandQueue(env.context, dev, 0, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
    k[b] = example_kernel(prog, "advect");
    int rows = r0[b + 1] - r0[b];
    size_t bytes = (size_t)(rows + 2 * HALO) * n * sizeof(float);
    float* band = (float*)malloc(bytes);
    for (int lr = 0; lr < rows + 2 * HALO; ++lr) {
      int gy = ((r0[b] + lr - HALO) % n + n) % n;
      memcpy(band + (size_t)lr * n, init + (size_t)gy * n, n * sizeof(float));
    }
    for (int p = 0; p < 2; ++p) buf[b][p] = example_buffer(&env, CL_MEM_READ_WRITE, bytes, NULL);
    CHECK(clEnqueueWriteBuffer(q[b], buf[b][0], CL_TRUE, 0, bytes, band, 0, NULL, NULL));
    free(band);
  }
  for (int b = 0; b < D; ++b) CHECK(clFinish(q[b]));

  double t0 = now_s();
  cl_event* kev = (cl_event*)calloc(D, sizeof *kev);
  size_t row_bytes = (size_t)n * sizeof(float);
  for (int s = 0; s < steps; ++s) {
    int in = s & 1, out = in ^ 1;
    for (int b = 0; b < D; ++b) {
      cl_int rows = r0[b + 1] - r0[b], start = r0[b], nn = n;
      CHECK(clSetKernelArg(k[b], 0, sizeof(cl_mem), &buf[b][in]));
      CHECK(clSetKernelArg(k[b], 1, sizeof(cl_mem), &buf[b][out]));
      CHECK(clSetKernelArg(k[b], 2, sizeof nn, &nn));
      CHECK(clSetKernelArg(k[b], 3, sizeof rows, &rows));
      CHECK(clSetKernelArg(k[b], 4, sizeof start, &start));
      CHECK(clSetKernelArg(k[b], 5, sizeof ca, &ca));
      CHECK(clSetKernelArg(k[b], 6, sizeof sa, &sa));
      size_t global[2] = {((size_t)n + 15) / 16 * 16, ((size_t)rows + 3) / 4 * 4}, local[2] = {16, 4};
      CHECK(clEnqueueNDRangeKernel(q[b], k[b], 2, NULL, global, local, 0, NULL, &kev[b]));
      CHECK(clFlush(q[b]));
    }
    /* Halos of band b: its top HALO rows are the last HALO rows of band b-1, its bottom HALO
     * rows the first HALO rows of band b+1 (periodic), copied on band b's own queue. */
    for (int b = 0; b < D; ++b) {
      int up = (b + D - 1) % D, down = (b + 1) % D, rows = r0[b + 1] - r0[b];
      int up_rows = r0[up + 1] - r0[up];
      cl_event wait[2] = {kev[up], kev[down]};
      cl_uint nwait = up == down ? 1 : 2;
      CHECK(clEnqueueCopyBuffer(q[b], buf[up][out], buf[b][out], (size_t)up_rows * row_bytes, 0,
                                HALO * row_bytes, nwait, wait, NULL));
      CHECK(clEnqueueCopyBuffer(q[b], buf[down][out], buf[b][out], (size_t)HALO * row_bytes,
                                (size_t)(HALO + rows) * row_bytes, HALO * row_bytes, nwait, wait, NULL));
      CHECK(clFlush(q[b]));
    }
    for (int b = 0; b < D; ++b) CHECK(clReleaseEvent(kev[b]));
  }
  for (int b = 0; b < D; ++b) CHECK(clFinish(q[b]));
  double elapsed = now_s() - t0;
  for (int b = 0; b < D; ++b) {
    int rows = r0[b + 1] - r0[b];
    CHECK(clEnqueueReadBuffer(q[b], buf[b][steps & 1], CL_TRUE, HALO * row_bytes, (size_t)rows * row_bytes,
                              result + (size_t)r0[b] * n, 0, NULL, NULL));
  }

  int failed = 0;
  double mass0 = field_sum(init, cells), mass = field_sum(result, cells);
  double drift = fabs(mass - mass0) / fabs(mass0), vmin = result[0], vmax = result[0];
  for (size_t i = 0; i < cells; ++i) {
    if (!isfinite(result[i])) {
      failed = 1;
      break;
    }
    if (result[i] < vmin) vmin = result[i];
    if (result[i] > vmax) vmax = result[i];
  }
  printf("advection: %dx%d periodic, %d steps, solid-body rotation %.6e rad/step, cubic Lagrange, halo %d\n", n,
         n, steps, w, HALO);
  printf("advection: checksum sum=%.6e min=%.6e max=%.6e\n", mass, vmin, vmax);
  if (drift < 1e-3) {
    printf("check: mass conserved (relative drift below 1e-3)\n");
  } else {
    printf("check: FAILED mass drift %.3e (mass0 %.6e)\n", drift, mass0);
    failed = 1;
  }
  if (check) {
    float* a = (float*)malloc(cells * sizeof(float));
    float* b = (float*)malloc(cells * sizeof(float));
    memcpy(a, init, cells * sizeof(float));
    for (int s = 0; s < steps; ++s) {
      cpu_step(a, b, n, ca, sa);
      float* t = a;
      a = b;
      b = t;
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < cells; ++i) {
      double d = fabs((double)result[i] - a[i]);
      if (d > worst || d != d) worst = d != d ? INFINITY : d;
      if (fabs(a[i]) > scale) scale = fabs(a[i]);
    }
    if (worst <= 1e-5 * scale) {
      printf("check: matches the CPU reference (relative 1e-5)\n");
    } else {
      printf("check: FAILED CPU reference differs by %.3e (scale %.3e)\n", worst, scale);
      failed = 1;
    }
    free(a);
    free(b);
  }
  printf("time: %.6f s for %d steps (%.3f ms/step), %d band(s)\n", elapsed, steps,
         steps ? 1e3 * elapsed / steps : 0.0, D);

  for (int b = 0; b < D; ++b) {
    CHECK(clReleaseMemObject(buf[b][0]));
    CHECK(clReleaseMemObject(buf[b][1]));
    CHECK(clReleaseKernel(k[b]));
    CHECK(clReleaseCommandQueue(q[b]));
  }
  CHECK(clReleaseProgram(prog));
  CHECK(clReleaseContext(env.context));
  free(q);
  free(k);
  free(buf);
  free(r0);
  free(kev);
  free(devs);
  free(init);
  free(result);
  puts(failed ? "advection: FAILED" : "advection: OK");
  return failed;
}
