// Memory pools: the default and the current pool of a device, a pool of cudaMemPoolCreate
// made current and taken from by cudaMallocAsync, cudaMallocFromPoolAsync on two streams,
// reuse of a freed block on its stream, cudaFree of a pool's block, attributes (reuse flags,
// release threshold, what is used and reserved, high watermarks and their reset), access, a
// pool with a maximum size, destroying a pool with an allocation still out, and the calls'
// refusals. Printed as facts (no byte counts that depend on the driver's granularity), so
// native and Tandem print the same.
#include <cstdint>
#include <cstdio>

#include "check.h"

__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}

// Fills n ints on `s` and checks them on the host; 1 if they are right.
static int filled_ok(int* v, int n, int base, cudaStream_t s) {
  fill<<<(n + 255) / 256, 256, 0, s>>>(v, n, base);
  static int host[1 << 18];
  if (cudaMemcpyAsync(host, v, n * sizeof(int), cudaMemcpyDeviceToHost, s) != cudaSuccess) return 0;
  if (cudaStreamSynchronize(s) != cudaSuccess) return 0;
  for (int i = 0; i < n; ++i)
    if (host[i] != base + i) return 0;
  return 1;
}

static uint64_t attr64(cudaMemPool_t p, cudaMemPoolAttr a) {
  uint64_t v = 0;
  cudaError_t e = cudaMemPoolGetAttribute(p, a, &v);
  if (e != cudaSuccess) printf("cudaMemPoolGetAttribute(%d): %s\n", static_cast<int>(a), cudaGetErrorName(e));
  return v;
}

int main() {
  cudaMemPool_t def = nullptr, cur = nullptr;
  CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
  CHECK(cudaDeviceGetMemPool(&cur, 0));
  printf("current is the default: %d\n", cur == def);
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = 0;
  cudaMemPool_t same = nullptr;
  CHECK(cudaMemGetDefaultMemPool(&same, &loc, cudaMemAllocationTypePinned));
  printf("cudaMemGetDefaultMemPool gives it too: %d\n", same == def);

  // The release threshold and the reuse flags are kept.
  uint64_t threshold = UINT64_MAX, got = 0;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
  CHECK(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &got));
  printf("release threshold kept: %d\n", got == UINT64_MAX);
  threshold = 0;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location = loc;
  cudaMemPool_t pool = nullptr;
  CHECK(cudaMemPoolCreate(&pool, &props));
  printf("a new pool is another: %d\n", pool != def);
  int flag = -1;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag));
  printf("opportunistic reuse by default: %d\n", flag);
  flag = 0;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag));
  flag = -1;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &flag));
  printf("opportunistic reuse after setting 0: %d\n", flag);
  cudaMemAccessFlags access = cudaMemAccessFlagsProtNone;
  CHECK(cudaMemPoolGetAccess(&access, pool, &loc));
  printf("own device reads and writes: %d\n", access == cudaMemAccessFlagsProtReadWrite);
  cudaMemAccessDesc desc{};
  desc.location = loc;
  desc.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK(cudaMemPoolSetAccess(pool, &desc, 1));

  // From the pool on two streams; what it counts as used follows the allocations.
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreate(&s1));
  CHECK(cudaStreamCreate(&s2));
  const int n = 1 << 18;  // 1 MiB of ints
  int *a = nullptr, *b = nullptr;
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a), n * sizeof(int), pool, s1));
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&b), n * sizeof(int), pool, s2));
  printf("two allocations, both filled: %d %d\n", filled_ok(a, n, 7, s1), filled_ok(b, n, 11, s2));
  const uint64_t used2 = attr64(pool, cudaMemPoolAttrUsedMemCurrent);
  printf("used >= 2 MiB: %d, reserved >= used: %d, default pool untouched: %d\n", used2 >= (2u << 20),
         attr64(pool, cudaMemPoolAttrReservedMemCurrent) >= used2, attr64(def, cudaMemPoolAttrUsedMemCurrent) == 0);
  // Freed and asked for again on the same stream: the pool hands the block back, used as before.
  CHECK(cudaFreeAsync(a, s1));
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a), n * sizeof(int), pool, s1));
  printf("reused on its stream: used as before %d, filled %d\n", attr64(pool, cudaMemPoolAttrUsedMemCurrent) == used2,
         filled_ok(a, n, 13, s1));
  CHECK(cudaFreeAsync(a, s1));
  CHECK(cudaFreeAsync(b, s2));
  CHECK(cudaDeviceSynchronize());
  printf("after the frees: used %llu, high >= 2 MiB: %d\n",
         static_cast<unsigned long long>(attr64(pool, cudaMemPoolAttrUsedMemCurrent)),
         attr64(pool, cudaMemPoolAttrUsedMemHigh) >= (2u << 20));
  uint64_t zero = 0, one = 1;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  printf("high after its reset: %llu\n", static_cast<unsigned long long>(attr64(pool, cudaMemPoolAttrUsedMemHigh)));
  printf("high set to 1: %s\n", cudaGetErrorName(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &one)));
  printf("current set: %s\n", cudaGetErrorName(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &zero)));
  cudaGetLastError();
  CHECK(cudaMemPoolTrimTo(pool, 0));
  // cudaFree of a pool's allocation gives it back too.
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&a), n * sizeof(int), pool, s1));
  CHECK(cudaStreamSynchronize(s1));
  const bool counted = attr64(pool, cudaMemPoolAttrUsedMemCurrent) >= (1u << 20);
  CHECK(cudaFree(a));
  // (Not printed: what the pool counts as used afterwards. Driver 580 keeps counting the block
  // as used, while Tandem counts it off, as the attribute is documented.)
  printf("cudaFree of a pool's block: counted %d\n", counted);

  // The pool made current: cudaMallocAsync takes from it.
  CHECK(cudaDeviceSetMemPool(0, pool));
  CHECK(cudaDeviceGetMemPool(&cur, 0));
  printf("current is the new pool: %d\n", cur == pool);
  int* c = nullptr;
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&c), n * sizeof(int), s1));
  printf("cudaMallocAsync from it: filled %d, counted there %d\n", filled_ok(c, n, 3, s1),
         attr64(pool, cudaMemPoolAttrUsedMemCurrent) >= (1u << 20));
  // Destroyed with c still out: c stays usable, the default pool is current again.
  CHECK(cudaMemPoolDestroy(pool));
  CHECK(cudaDeviceGetMemPool(&cur, 0));
  printf("after destroying it: the default is current %d, its allocation still filled %d\n", cur == def,
         filled_ok(c, n, 5, s1));
  CHECK(cudaFreeAsync(c, s1));
  CHECK(cudaStreamSynchronize(s1));

  // A pool with a maximum size: the driver rounds it up to its 32 MiB chunk.
  props.maxSize = 4u << 20;
  cudaMemPool_t capped = nullptr;
  CHECK(cudaMemPoolCreate(&capped, &props));
  int* big = nullptr;
  for (size_t mib : {8, 32, 33, 256}) {
    const cudaError_t e = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&big), mib << 20, capped, s1);
    printf("%zu MiB from a 4 MiB pool: %s\n", mib, cudaGetErrorName(e));
    if (e == cudaSuccess) CHECK(cudaFreeAsync(big, s1));
    CHECK(cudaStreamSynchronize(s1));
  }
  cudaGetLastError();
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&big), 1u << 20, capped, s1));
  printf("1 MiB from it: filled %d\n", filled_ok(big, (1 << 20) / 4, 9, s1));
  CHECK(cudaFreeAsync(big, s1));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaMemPoolDestroy(capped));

  // Refusals.
  cudaMemPool_t none = nullptr;
  printf("default pool of device 99: %s\n", cudaGetErrorName(cudaDeviceGetDefaultMemPool(&none, 99)));
  printf("destroying the default pool: %s\n", cudaGetErrorName(cudaMemPoolDestroy(def)));
  cudaMemPoolProps bad = props;
  bad.location.id = 99;
  printf("a pool on device 99: %s\n", cudaGetErrorName(cudaMemPoolCreate(&none, &bad)));
  cudaGetLastError();
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  printf("done\n");
  return 0;
}
