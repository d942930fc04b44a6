/* Buffer commands without kernels: fill (1, 4 and 16-byte patterns), copy, rectangular
 * read/write/copy, and read-backs at offsets. */
#include "common.h"

enum { N = 4096 };

static int check_fill(example_env* env) {
  cl_mem m = example_buffer(env, CL_MEM_READ_WRITE, N, NULL);
  unsigned char out[N];
  cl_uchar p1 = 0x5A;
  cl_uint p4 = 0xDEADBEEFu;
  cl_uint p16[4] = {1, 2, 3, 4};
  CHECK(clEnqueueFillBuffer(env->queue, m, &p1, 1, 0, N, 0, NULL, NULL));
  CHECK(clEnqueueFillBuffer(env->queue, m, &p4, 4, 256, 1024, 0, NULL, NULL));
  CHECK(clEnqueueFillBuffer(env->queue, m, p16, 16, 2048, 512, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env->queue, m, CL_TRUE, 0, N, out, 0, NULL, NULL));
  int bad = 0;
  for (int i = 0; i < N; ++i) {
    unsigned char want = 0x5A;
    if (i >= 256 && i < 1280) want = ((const unsigned char*)&p4)[(i - 256) % 4];
    if (i >= 2048 && i < 2560) want = ((const unsigned char*)p16)[(i - 2048) % 16];
    if (out[i] != want) ++bad;
  }
  printf("fill: patterns 1/4/16 bytes mismatches=%d checksum=%08x\n", bad, example_fnv(out, N));
  clReleaseMemObject(m);
  return bad;
}

static int check_copy(example_env* env) {
  int src[N], dst[N];
  for (int i = 0; i < N; ++i) src[i] = i * 3 + 1;
  cl_mem a = example_buffer(env, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof src, src);
  cl_mem b = example_buffer(env, CL_MEM_READ_WRITE, sizeof src, NULL);
  int zero = 0;
  CHECK(clEnqueueFillBuffer(env->queue, b, &zero, sizeof zero, 0, sizeof src, 0, NULL, NULL));
  CHECK(clEnqueueCopyBuffer(env->queue, a, b, 0, 0, sizeof src / 2, 0, NULL, NULL));
  CHECK(clEnqueueCopyBuffer(env->queue, a, b, 100 * sizeof(int), 3000 * sizeof(int), 50 * sizeof(int), 0, NULL, NULL));
  /* Copy inside one buffer, regions apart. */
  CHECK(clEnqueueCopyBuffer(env->queue, b, b, 0, 3500 * sizeof(int), 10 * sizeof(int), 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env->queue, b, CL_TRUE, 0, sizeof dst, dst, 0, NULL, NULL));
  int bad = 0;
  for (int i = 0; i < N; ++i) {
    int want = 0;
    if (i < N / 2) want = src[i];
    if (i >= 3000 && i < 3050) want = src[i - 3000 + 100];
    if (i >= 3500 && i < 3510) want = src[i - 3500];
    if (dst[i] != want) ++bad;
  }
  /* A partial read at an offset. */
  int part[8];
  CHECK(clEnqueueReadBuffer(env->queue, b, CL_TRUE, 3001 * sizeof(int), sizeof part, part, 0, NULL, NULL));
  for (int i = 0; i < 8; ++i)
    if (part[i] != src[101 + i]) ++bad;
  printf("copy: whole, offset, same-buffer, partial read mismatches=%d checksum=%08x\n", bad,
         example_fnv(dst, sizeof dst));
  clReleaseMemObject(a);
  clReleaseMemObject(b);
  return bad;
}

static int check_rect(example_env* env) {
  /* A 64x32 byte image with row pitch 64; move a 10x7 box around. */
  enum { W = 64, H = 32 };
  unsigned char host[W * H], out[W * H], box[10 * 7];
  for (int i = 0; i < W * H; ++i) host[i] = (unsigned char)(i * 7);
  cl_mem a = example_buffer(env, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host);
  cl_mem b = example_buffer(env, CL_MEM_READ_WRITE, sizeof host, NULL);
  unsigned char z = 0;
  CHECK(clEnqueueFillBuffer(env->queue, b, &z, 1, 0, sizeof host, 0, NULL, NULL));
  size_t so[3] = {3, 4, 0}, dor[3] = {40, 20, 0}, region[3] = {10, 7, 1};
  CHECK(clEnqueueCopyBufferRect(env->queue, a, b, so, dor, region, W, 0, W, 0, 0, NULL, NULL));
  /* Read the box back with a tight host pitch, then write it elsewhere from the host. */
  size_t ho[3] = {0, 0, 0};
  CHECK(clEnqueueReadBufferRect(env->queue, b, CL_TRUE, dor, ho, region, W, 0, 10, 0, box, 0, NULL, NULL));
  size_t wo[3] = {1, 1, 0};
  CHECK(clEnqueueWriteBufferRect(env->queue, b, CL_TRUE, wo, ho, region, W, 0, 10, 0, box, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(env->queue, b, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
  int bad = 0;
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 10; ++x)
      if (box[y * 10 + x] != host[(4 + y) * W + 3 + x]) ++bad;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      unsigned char want = 0;
      if (x >= 40 && x < 50 && y >= 20 && y < 27) want = host[(y - 20 + 4) * W + (x - 40 + 3)];
      if (x >= 1 && x < 11 && y >= 1 && y < 8) want = host[(y - 1 + 4) * W + (x - 1 + 3)];
      if (out[y * W + x] != want) ++bad;
    }
  printf("rect: copy, read, write of a 10x7 box mismatches=%d checksum=%08x\n", bad, example_fnv(out, sizeof out));
  clReleaseMemObject(a);
  clReleaseMemObject(b);
  return bad;
}

static int check_bounds(example_env* env) {
  cl_mem m = example_buffer(env, CL_MEM_READ_WRITE, 1024, NULL);
  char buf[64];
  cl_int e1 = clEnqueueReadBuffer(env->queue, m, CL_TRUE, 1000, 64, buf, 0, NULL, NULL);
  cl_mem other = example_buffer(env, CL_MEM_READ_WRITE, 1024, NULL);
  cl_int e2 = clEnqueueCopyBuffer(env->queue, m, other, 0, 1000, 64, 0, NULL, NULL);
  printf("out of range read: %s, out of range copy: %s\n", e1 == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "other",
         e2 == CL_INVALID_VALUE ? "CL_INVALID_VALUE" : "other");
  clReleaseMemObject(m);
  clReleaseMemObject(other);
  return (e1 == CL_INVALID_VALUE && e2 == CL_INVALID_VALUE) ? 0 : 1;
}

int main(void) {
  example_env env;
  example_pick(&env, 0);
  int bad = check_fill(&env) + check_copy(&env) + check_rect(&env) + check_bounds(&env);
  printf("buffer_ops: %s\n", bad ? "FAIL" : "ok");
  example_release(&env);
  return bad ? 1 : 0;
}
