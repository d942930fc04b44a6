/* C = A·B (float, N×N) split over D devices with the blocks of B circulating around a ring.
 *
 * Rows are split into D bands (band i: rows r0[i] .. r0[i+1]). Device i holds band i of A
 * and computes band i of C. B is split the same way into D row blocks; device i starts with
 * block i. In round t (t = 0 .. D-1) device i holds block k = (i + t) mod D and adds
 * A[band i, columns of block k] · B[block k] into its C band, while it receives block
 * k + 1 from device i + 1's current buffer (clEnqueueCopyBuffer into its second B buffer):
 * D - 1 rounds of partial exchange, each overlapped with the compute of the round.
 *
 * Queues: all devices of the first platform that has one, in ONE context; device i's work
 * goes to a compute queue and a transfer queue on device i % ndev (round-robin when the
 * platform has fewer than D devices). Events order the ring:
 *   kernel  K[t][i] waits for X[t-1][i] (its block has arrived);
 *   copy    X[t][i] waits for X[t-1][i+1] (the source block has arrived there),
 *           K[t-1][i] and X[t-1][i-1] (nobody reads the destination buffer any more).
 *
 * The entries of A and B are multiples of 1/4 in [-1, 1], so every product and partial sum
 * is exact in float for N <= 2^16: C is the same bit for bit whatever the order of the
 * blocks, hence for any D. Self-check: 256 entries (fixed-seed positions) against a CPU dot
 * product in double (relative 1e-3), plus the checksum of all of C. Timings, GFLOP/s and
 * device names are on lines that start with "time:" (tests drop them).
 *
 * Usage: multi_matmul [--n N] [--devices D] */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <time.h>

#include "common.h"

#define TILE 16

static const char* kSrc =
    "#define TILE 16\n"
    "/* Cb[r][c] += sum over kk < kb of Ab[r][k0 + kk] * Bk[kk][c]; Ab is rows x n, Bk kb x n. */\n"
    "__kernel void matmul_block(__global const float* Ab, __global const float* Bk,\n"
    "                           __global float* Cb, const int n, const int rows,\n"
    "                           const int k0, const int kb) {\n"
    "  __local float As[TILE][TILE];\n"
    "  __local float Bs[TILE][TILE];\n"
    "  int tx = get_local_id(0), ty = get_local_id(1);\n"
    "  int col = get_global_id(0), row = get_global_id(1);\n"
    "  float acc = 0.0f;\n"
    "  for (int t = 0; t < kb; t += TILE) {\n"
    "    As[ty][tx] = (row < rows && t + tx < kb) ? Ab[row * n + k0 + t + tx] : 0.0f;\n"
    "    Bs[ty][tx] = (col < n && t + ty < kb) ? Bk[(t + ty) * n + col] : 0.0f;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  }\n"
    "  if (row < rows && col < n) Cb[row * n + col] += acc;\n"
    "}\n";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A fixed-seed generator (64-bit LCG, high bits): the same numbers everywhere. */
static unsigned rnd(unsigned long long* s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (unsigned)(*s >> 33);
}

int main(int argc, char** argv) {
  int n = 2048, D = 4;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--devices") && i + 1 < argc) D = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--n N] [--devices D]\n", argv[0]);
      return 2;
    }
  }
  if (n < 1 || n > 65536 || D < 1 || D > n) {
    fprintf(stderr, "multi_matmul: need 1 <= n <= 65536 and 1 <= devices <= n\n");
    return 2;
  }

  example_env env;
  cl_uint ndev = 0;
  cl_device_id* devs = example_pick_all(&env, &ndev);
  cl_int err;
  cl_program prog = example_build_for(&env, ndev, devs, kSrc, "-cl-std=CL1.2");
  char* pname = example_platform_str(env.platform, CL_PLATFORM_NAME);
  printf("time: platform %s, %u device(s), %d band(s)\n", pname, ndev, D);
  free(pname);

  size_t nn = (size_t)n * n;
  float* A = (float*)malloc(nn * sizeof(float));
  float* B = (float*)malloc(nn * sizeof(float));
  float* C = (float*)malloc(nn * sizeof(float));
  unsigned long long seed = 20240611ULL;
  for (size_t i = 0; i < nn; ++i) A[i] = 0.25f * (float)((int)(rnd(&seed) % 9) - 4);
  for (size_t i = 0; i < nn; ++i) B[i] = 0.25f * (float)((int)(rnd(&seed) % 9) - 4);

  int* r0 = (int*)calloc(D + 1, sizeof(int));
  int maxrows = 0;
  for (int b = 0; b <= D; ++b) r0[b] = (int)((long)n * b / D);
  for (int b = 0; b < D; ++b)
    if (r0[b + 1] - r0[b] > maxrows) maxrows = r0[b + 1] - r0[b];
  size_t row_bytes = (size_t)n * sizeof(float);

  cl_command_queue* qc = (cl_command_queue*)calloc(D, sizeof *qc);
  cl_command_queue* qx = (cl_command_queue*)calloc(D, sizeof *qx);
  cl_kernel* k = (cl_kernel*)calloc(D, sizeof *k);
  cl_mem *dA = (cl_mem*)calloc(D, sizeof(cl_mem)), *dC = (cl_mem*)calloc(D, sizeof(cl_mem));
  cl_mem(*dB)[2] = calloc(D, sizeof *dB);
  for (int i = 0; i < D; ++i) {
    cl_device_id dev = devs[i % ndev];
    qc[i] = clCreateCommandQueue(env.context, dev, 0, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
    qx[i] = clCreateCommandQueue(env.context, dev, 0, &err);
    CHECK_ERR(err, "clCreateCommandQueue");
    k[i] = example_kernel(prog, "matmul_block");
    size_t rows = (size_t)(r0[i + 1] - r0[i]);
    dA[i] = example_buffer(&env, CL_MEM_READ_ONLY, rows * row_bytes, NULL);
    dC[i] = example_buffer(&env, CL_MEM_READ_WRITE, rows * row_bytes, NULL);
    for (int p = 0; p < 2; ++p) dB[i][p] = example_buffer(&env, CL_MEM_READ_WRITE, (size_t)maxrows * row_bytes, NULL);
    CHECK(clEnqueueWriteBuffer(qc[i], dA[i], CL_FALSE, 0, rows * row_bytes, A + (size_t)r0[i] * n, 0, NULL, NULL));
    CHECK(clEnqueueWriteBuffer(qc[i], dB[i][0], CL_FALSE, 0, rows * row_bytes, B + (size_t)r0[i] * n, 0, NULL, NULL));
    float zero = 0.0f;
    CHECK(clEnqueueFillBuffer(qc[i], dC[i], &zero, sizeof zero, 0, rows * row_bytes, 0, NULL, NULL));
  }
  for (int i = 0; i < D; ++i) CHECK(clFinish(qc[i]));

  double t0 = now_s();
  cl_event* kev = (cl_event*)calloc((size_t)D * D, sizeof(cl_event)); /* K[t][i] = kev[t*D+i] */
  cl_event* xev = (cl_event*)calloc((size_t)D * D, sizeof(cl_event)); /* X[t][i] = xev[t*D+i] */
  for (int t = 0; t < D; ++t) {
    for (int i = 0; i < D; ++i) {
      int blk = (i + t) % D;
      cl_int nn_ = n, rows = r0[i + 1] - r0[i], k0 = r0[blk], kb = r0[blk + 1] - r0[blk];
      CHECK(clSetKernelArg(k[i], 0, sizeof(cl_mem), &dA[i]));
      CHECK(clSetKernelArg(k[i], 1, sizeof(cl_mem), &dB[i][t & 1]));
      CHECK(clSetKernelArg(k[i], 2, sizeof(cl_mem), &dC[i]));
      CHECK(clSetKernelArg(k[i], 3, sizeof nn_, &nn_));
      CHECK(clSetKernelArg(k[i], 4, sizeof rows, &rows));
      CHECK(clSetKernelArg(k[i], 5, sizeof k0, &k0));
      CHECK(clSetKernelArg(k[i], 6, sizeof kb, &kb));
      size_t global[2] = {((size_t)n + TILE - 1) / TILE * TILE, ((size_t)rows + TILE - 1) / TILE * TILE};
      size_t local[2] = {TILE, TILE};
      cl_uint nw = t > 0 ? 1 : 0;
      CHECK(clEnqueueNDRangeKernel(qc[i], k[i], 2, NULL, global, local, nw, nw ? &xev[(t - 1) * D + i] : NULL,
                                   &kev[t * D + i]));
      CHECK(clFlush(qc[i]));
    }
    if (t == D - 1) break;
    for (int i = 0; i < D; ++i) {
      int next = (i + 1) % D, prev = (i + D - 1) % D, blk = (i + t + 1) % D;
      cl_event wait[3];
      cl_uint nw = 0;
      if (t > 0) {
        wait[nw++] = xev[(t - 1) * D + next];
        wait[nw++] = kev[(t - 1) * D + i];
        if (prev != next) wait[nw++] = xev[(t - 1) * D + prev];
      }
      /* Device i+1's current buffer holds block blk in this round: into i's other buffer. */
      CHECK(clEnqueueCopyBuffer(qx[i], dB[next][t & 1], dB[i][(t + 1) & 1], 0, 0,
                                (size_t)(r0[blk + 1] - r0[blk]) * row_bytes, nw, nw ? wait : NULL,
                                &xev[t * D + i]));
      CHECK(clFlush(qx[i]));
    }
  }
  for (int i = 0; i < D; ++i) {
    CHECK(clFinish(qx[i]));
    CHECK(clFinish(qc[i]));
  }
  double elapsed = now_s() - t0;
  for (int i = 0; i < D * D; ++i) {
    if (kev[i]) CHECK(clReleaseEvent(kev[i]));
    if (xev[i]) CHECK(clReleaseEvent(xev[i]));
  }
  for (int i = 0; i < D; ++i)
    CHECK(clEnqueueReadBuffer(qc[i], dC[i], CL_TRUE, 0, (size_t)(r0[i + 1] - r0[i]) * row_bytes,
                              C + (size_t)r0[i] * n, 0, NULL, NULL));

  /* 256 sampled entries against a CPU dot product in double. */
  int bad = 0;
  unsigned long long pick = 42ULL;
  for (int s = 0; s < 256; ++s) {
    int i = (int)(rnd(&pick) % (unsigned)n), j = (int)(rnd(&pick) % (unsigned)n);
    double ref = 0, mag = 0;
    for (int kk = 0; kk < n; ++kk) {
      ref += (double)A[(size_t)i * n + kk] * B[(size_t)kk * n + j];
      mag += fabs((double)A[(size_t)i * n + kk] * B[(size_t)kk * n + j]);
    }
    double got = C[(size_t)i * n + j];
    if (!(fabs(got - ref) <= 1e-3 * (mag > 1 ? mag : 1))) {
      if (bad < 5) fprintf(stderr, "C[%d][%d] = %.9g, expected %.9g\n", i, j, got, ref);
      ++bad;
    }
  }
  double sum = 0, trace = 0;
  for (size_t i = 0; i < nn; ++i) sum += C[i];
  for (int i = 0; i < n; ++i) trace += C[(size_t)i * n + i];
  printf("multi_matmul: %dx%d float, B blocks circulate on a ring of bands\n", n, n);
  printf("multi_matmul: sum=%.6e trace=%.6e checksum=%08x\n", sum, trace, example_fnv(C, nn * sizeof(float)));
  if (bad == 0)
    printf("check: 256 sampled entries match the CPU (relative 1e-3)\n");
  else
    printf("check: FAILED %d of 256 sampled entries differ from the CPU\n", bad);
  printf("time: %.6f s, %.2f GFLOP/s (%d band(s), %d ring round(s))\n", elapsed,
         elapsed > 0 ? 2.0 * n * (double)n * n / elapsed * 1e-9 : 0.0, D, D - 1);

  for (int i = 0; i < D; ++i) {
    CHECK(clReleaseMemObject(dA[i]));
    CHECK(clReleaseMemObject(dC[i]));
    CHECK(clReleaseMemObject(dB[i][0]));
    CHECK(clReleaseMemObject(dB[i][1]));
    CHECK(clReleaseKernel(k[i]));
    CHECK(clReleaseCommandQueue(qc[i]));
    CHECK(clReleaseCommandQueue(qx[i]));
  }
  CHECK(clReleaseProgram(prog));
  CHECK(clReleaseContext(env.context));
  free(qc);
  free(qx);
  free(k);
  free(dA);
  free(dC);
  free(dB);
  free(kev);
  free(xev);
  free(r0);
  free(devs);
  free(A);
  free(B);
  free(C);
  puts(bad ? "multi_matmul: FAILED" : "multi_matmul: OK");
  return bad ? 1 : 0;
}
