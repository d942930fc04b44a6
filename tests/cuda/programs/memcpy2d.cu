// Pitched memory: cudaMallocPitch, cudaMemcpy2D in every direction (device-to-device as one
// rectangular copy), cudaMemset and cudaMemset2D, and cudaMemsetAsync.
#include <cstdio>
#include <vector>

#include "check.h"

__global__ void mark(char* p, size_t pitch, int width, int height) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < width && y < height) p[y * pitch + x] += 1;
}

int main() {
  const int width = 100, height = 37;  // bytes per row, rows
  std::vector<char> host(width * height), back(width * height);
  for (int i = 0; i < width * height; ++i) host[i] = char(i % 101);
  char *a, *b;
  size_t pa = 0, pb = 0;
  CHECK(cudaMallocPitch((void**)&a, &pa, width, height));
  CHECK(cudaMallocPitch((void**)&b, &pb, width, height));
  printf("pitch covers a row and is aligned: %s\n", pa >= width && pa % 32 == 0 && pa == pb ? "yes" : "no");
  CHECK(cudaMemset(a, 0, pa * height));
  CHECK(cudaMemcpy2D(a, pa, host.data(), width, width, height, cudaMemcpyHostToDevice));
  mark<<<height, 128>>>(a, pa, width, height);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy2D(b, pb, a, pa, width, height, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy2D(back.data(), width, b, pb, width, height, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < width * height; ++i) wrong += back[i] != char(i % 101 + 1);
  printf("2D round trip: %d wrong\n", wrong);

  // Fill a sub-rectangle, then read the whole thing.
  CHECK(cudaMemset2D(b, pb, 7, width / 2, height / 2));
  CHECK(cudaMemcpy2D(back.data(), width, b, pb, width, height, cudaMemcpyDeviceToHost));
  int sevens = 0;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) sevens += back[y * width + x] == 7;
  printf("bytes set to 7: %d\n", sevens);

  CHECK(cudaMemsetAsync(a, 0x5a, pa * height, 0));
  char c = 0;
  CHECK(cudaMemcpy(&c, a + pa * (height - 1) + width - 1, 1, cudaMemcpyDeviceToHost));
  printf("last byte after async memset: 0x%02x\n", (unsigned char)c);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return wrong || c != 0x5a;
}
