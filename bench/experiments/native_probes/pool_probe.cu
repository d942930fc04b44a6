// Native probe (nvcc -O2 pool_probe.cu; run on the GPU machine): how driver 580 caps a pool of
// maxSize, and what a pool counts as used after cudaFree of its block. Output: bench/results/2026-11-27-e.
#include <cstdio>
#include <cstdint>
static uint64_t used(cudaMemPool_t p, cudaMemPoolAttr a = cudaMemPoolAttrUsedMemCurrent) {
  uint64_t v = 0; cudaMemPoolGetAttribute(p, a, &v); return v;
}
int main() {
  cudaStream_t s; cudaStreamCreate(&s);
  cudaMemPoolProps props{}; props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice; props.location.id = 0;
  size_t caps[] = {4, 8, 31, 32, 33, 40, 64, 100};
  size_t sizes[] = {1, 2, 4, 8, 16, 24, 30, 31, 32, 33, 34, 40, 48, 63, 64, 65, 96, 100, 127, 128, 129};
  for (size_t cap : caps) {
    props.maxSize = cap << 20;
    cudaMemPool_t p; if (cudaMemPoolCreate(&p, &props) != cudaSuccess) { printf("cap %zu: create failed\n", cap); continue; }
    printf("cap %3zu MiB fits:", cap);
    for (size_t mib : sizes) {
      void* x = nullptr;
      cudaError_t e = cudaMallocFromPoolAsync(&x, mib << 20, p, s);
      if (e == cudaSuccess) { printf(" %zu", mib); cudaFreeAsync(x, s); }
      cudaStreamSynchronize(s); cudaGetLastError();
    }
    // two allocations that each fit but not together?
    void *a = nullptr, *b = nullptr;
    cudaError_t ea = cudaMallocFromPoolAsync(&a, (cap << 20) / 2 + (1 << 20), p, s);
    cudaError_t eb = cudaMallocFromPoolAsync(&b, (cap << 20) / 2 + (1 << 20), p, s);
    printf(" | two of half+1MiB: %s %s, reserved %llu MiB\n", cudaGetErrorName(ea), cudaGetErrorName(eb),
           (unsigned long long)(used(p, cudaMemPoolAttrReservedMemCurrent) >> 20));
    if (ea == cudaSuccess) cudaFreeAsync(a, s);
    if (eb == cudaSuccess) cudaFreeAsync(b, s);
    cudaStreamSynchronize(s); cudaGetLastError();
    cudaMemPoolDestroy(p);
  }
  props.maxSize = 0;
  cudaMemPool_t p; cudaMemPoolCreate(&p, &props);
  void* x = nullptr;
  cudaMallocFromPoolAsync(&x, 1 << 20, p, s); cudaStreamSynchronize(s);
  printf("before cudaFree: used %llu reserved %llu\n", (unsigned long long)used(p), (unsigned long long)used(p, cudaMemPoolAttrReservedMemCurrent));
  cudaError_t e = cudaFree(x);
  printf("cudaFree: %s; used %llu reserved %llu\n", cudaGetErrorName(e), (unsigned long long)used(p), (unsigned long long)used(p, cudaMemPoolAttrReservedMemCurrent));
  cudaDeviceSynchronize();
  printf("after a device sync: used %llu reserved %llu\n", (unsigned long long)used(p), (unsigned long long)used(p, cudaMemPoolAttrReservedMemCurrent));
  void* y = nullptr;
  cudaMallocFromPoolAsync(&y, 1 << 20, p, s); cudaFreeAsync(y, s); cudaStreamSynchronize(s);
  printf("after another alloc+free on a stream: used %llu reserved %llu, same address %d\n", (unsigned long long)used(p), (unsigned long long)used(p, cudaMemPoolAttrReservedMemCurrent), x == y);
  cudaMemPoolTrimTo(p, 0);
  printf("after trim: used %llu reserved %llu\n", (unsigned long long)used(p), (unsigned long long)used(p, cudaMemPoolAttrReservedMemCurrent));
  // capturing a graph launch
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  cudaStreamCaptureStatus st; cudaStreamIsCapturing(s, &st);
  printf("graph-launch probe skipped; capture status %d\n", (int)st);
  cudaGraph_t g; cudaStreamEndCapture(s, &g);
  return 0;
}
