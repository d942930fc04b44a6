// 3-D copies and fills between pitched allocations (cudaMalloc3D) and host volumes: a whole
// volume up, a sub-box moved on the device at offsets, a slab filled, a sub-box read back
// asynchronously into a host volume at an offset, everything checked against the CPU.
#include <cstdio>
#include <vector>

#include "check.h"

__global__ void bump(cudaPitchedPtr p, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, z = blockIdx.z;
  if (x >= w || y >= h || z >= d) return;
  int* row = reinterpret_cast<int*>(static_cast<char*>(p.ptr) + (z * p.ysize + y) * p.pitch);
  row[x] += 1000 * z + y;
}

int main() {
  const int W = 37, H = 19, D = 7;  // ints
  cudaExtent ext = make_cudaExtent(W * sizeof(int), H, D);
  cudaPitchedPtr a, b;
  CHECK(cudaMalloc3D(&a, ext));
  CHECK(cudaMalloc3D(&b, ext));
  printf("pitch covers a row: %s\n", a.pitch >= W * sizeof(int) && a.ysize == H ? "yes" : "no");
  std::vector<int> host(W * H * D), expect(W * H * D);
  for (int i = 0; i < W * H * D; ++i) host[i] = expect[i] = i * 7 - 3;

  cudaMemcpy3DParms up = {};
  up.srcPtr = make_cudaPitchedPtr(host.data(), W * sizeof(int), W, H);
  up.dstPtr = a;
  up.extent = ext;
  up.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&up));
  bump<<<dim3((W + 31) / 32, H, D), 32>>>(a, W, H, D);
  CHECK(cudaGetLastError());
  for (int z = 0; z < D; ++z)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) expect[(z * H + y) * W + x] += 1000 * z + y;

  // b := 0, then a's box (x 3..3+10, y 2..2+8, z 1..1+4) into b at (x 20, y 9, z 2).
  CHECK(cudaMemset3D(b, 0, ext));
  std::vector<int> eb(W * H * D, 0);
  cudaMemcpy3DParms dd = {};
  dd.srcPtr = a;
  dd.srcPos = make_cudaPos(3 * sizeof(int), 2, 1);
  dd.dstPtr = b;
  dd.dstPos = make_cudaPos(20 * sizeof(int), 9, 2);
  dd.extent = make_cudaExtent(10 * sizeof(int), 8, 4);
  dd.kind = cudaMemcpyDeviceToDevice;
  CHECK(cudaMemcpy3D(&dd));
  for (int z = 0; z < 4; ++z)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 10; ++x) eb[((z + 2) * H + y + 9) * W + x + 20] = expect[((z + 1) * H + y + 2) * W + x + 3];
  // A slab of b (z 5, all rows, the first 16 ints) filled with 0x7f bytes.
  cudaPitchedPtr slab = b;
  slab.ptr = static_cast<char*>(b.ptr) + 5 * b.pitch * b.ysize;
  CHECK(cudaMemset3DAsync(slab, 0x7f, make_cudaExtent(16 * sizeof(int), H, 1), 0));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < 16; ++x) eb[(5 * H + y) * W + x] = 0x7f7f7f7f;

  // All of b back, asynchronously, into a host volume one slice and two rows in.
  const int HD = D + 1, HH = H + 2;
  std::vector<int> back(W * HH * HD, -1), eback(W * HH * HD, -1);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaMemcpy3DParms down = {};
  down.srcPtr = b;
  down.dstPtr = make_cudaPitchedPtr(back.data(), W * sizeof(int), W, HH);
  down.dstPos = make_cudaPos(0, 2, 1);
  down.extent = ext;
  down.kind = cudaMemcpyDefault;
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy3DAsync(&down, s));
  CHECK(cudaStreamSynchronize(s));
  for (int z = 0; z < D; ++z)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) eback[((z + 1) * HH + y + 2) * W + x] = eb[(z * H + y) * W + x];
  int bad = 0;
  long sum = 0;
  for (size_t i = 0; i < back.size(); ++i) {
    bad += back[i] != eback[i];
    sum += back[i];
  }
  printf("volume back: %d wrong of %zu, sum %ld\n", bad, back.size(), sum);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(a.ptr));
  CHECK(cudaFree(b.ptr));
  return bad != 0;
}
