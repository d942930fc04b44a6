/* The advection kernel (see advection.c for the scheme), shared by advection.c and
 * bench/advection_procs.c, which runs the same bands in separate processes. */
#ifndef TANDEM_EXAMPLES_ADVECTION_KERNEL_H
#define TANDEM_EXAMPLES_ADVECTION_KERNEL_H

#include <math.h>
#include <stddef.h>

#define HALO 3

static const char* kSrc =
    "#define HALO 3\n"
    "void weights(float t, float* w) {\n"
    "  w[0] = -t * (t - 1.0f) * (t - 2.0f) / 6.0f;\n"
    "  w[1] = (t + 1.0f) * (t - 1.0f) * (t - 2.0f) / 2.0f;\n"
    "  w[2] = -(t + 1.0f) * t * (t - 2.0f) / 2.0f;\n"
    "  w[3] = (t + 1.0f) * t * (t - 1.0f) / 6.0f;\n"
    "}\n"
    "/* in/out: (HALO + rows + HALO) x n, local row lr holds global row r0 + lr - HALO. */\n"
    "__kernel void advect(__global const float* in, __global float* out, const int n,\n"
    "                     const int rows, const int r0, const float ca, const float sa) {\n"
    "  int x = get_global_id(0), lr = get_global_id(1);\n"
    "  if (x >= n || lr >= rows) return;\n"
    "  int y = r0 + lr;\n"
    "  float c = 0.5f * (float)n;\n"
    "  float xd = c + ca * ((float)x - c) + sa * ((float)y - c);\n"
    "  float yd = c - sa * ((float)x - c) + ca * ((float)y - c);\n"
    "  float fx = floor(xd), fy = floor(yd);\n"
    "  float wx[4], wy[4];\n"
    "  weights(xd - fx, wx);\n"
    "  weights(yd - fy, wy);\n"
    "  int ix = (int)fx, iy = (int)fy;\n"
    "  float acc = 0.0f;\n"
    "  for (int j = 0; j < 4; ++j) {\n"
    "    __global const float* row = in + (iy - 1 + j - r0 + HALO) * n;\n"
    "    float s = 0.0f;\n"
    "    for (int i = 0; i < 4; ++i) s += wx[i] * row[((ix - 1 + i) % n + n) % n];\n"
    "    acc += wy[j] * s;\n"
    "  }\n"
    "  out[(lr + HALO) * n + x] = acc;\n"
    "}\n";

/* The initial field: two Gaussian blobs, small near the edges. */
static void advection_init(float* f, int n) {
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) {
      double s = n / 16.0, ax = x - 0.70 * n, ay = y - 0.50 * n, bx = x - 0.40 * n, by = y - 0.35 * n;
      f[(size_t)y * n + x] = (float)(exp(-(ax * ax + ay * ay) / (2 * s * s)) +
                                     0.5 * exp(-(bx * bx + by * by) / (2 * s * s)));
    }
}

#endif
