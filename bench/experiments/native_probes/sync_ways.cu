// How fast can a host thread learn that an empty kernel ended? Natively, on the GPU machine,
// one empty kernel on the legacy stream and one way of waiting, N times per way (p50 / p10 /
// p90, µs), interleaved in R rounds so that drift hits every way alike:
//   ctx        cuCtxSynchronize (what tandemd does for cudaDeviceSynchronize)
//   stream     cuStreamSynchronize on the legacy stream
//   event      cuEventRecord (timing off) + cuEventSynchronize
//   equery     cuEventRecord (timing off) + cuEventQuery until it is done
//   squery     cuStreamQuery on the legacy stream until it is done
// The primary context's scheduling flag is the first argument (auto, spin, yield, blocking),
// set before the context exists: tandemd leaves it at auto.
//   nvcc -O2 -o /tmp/sync_ways bench/experiments/native_probes/sync_ways.cu -lcuda
//   for f in auto spin yield; do /tmp/sync_ways $f 2000 5; done
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void empty_kernel() {}

namespace {

using Clock = std::chrono::steady_clock;

void Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  std::fprintf(stderr, "sync_ways: %s: %s\n", what, s ? s : "?");
  std::exit(1);
}

enum Way { kCtx, kStream, kEvent, kEventQuery, kStreamQuery, kWays };
const char* const kNames[kWays] = {"ctx", "stream", "event", "equery", "squery"};

}  // namespace

int main(int argc, char** argv) {
  const char* flag = argc > 1 ? argv[1] : "auto";
  const int n = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  unsigned flags = CU_CTX_SCHED_AUTO;
  if (!std::strcmp(flag, "spin")) flags = CU_CTX_SCHED_SPIN;
  else if (!std::strcmp(flag, "yield")) flags = CU_CTX_SCHED_YIELD;
  else if (!std::strcmp(flag, "blocking")) flags = CU_CTX_SCHED_BLOCKING_SYNC;
  else if (std::strcmp(flag, "auto") != 0) {
    std::fprintf(stderr, "usage: sync_ways [auto|spin|yield|blocking] [N] [ROUNDS]\n");
    return 2;
  }
  Check(cuInit(0), "cuInit");
  CUdevice dev;
  Check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  Check(cuDevicePrimaryCtxSetFlags(dev, flags), "cuDevicePrimaryCtxSetFlags");
  CUcontext ctx;
  Check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  CUevent ev;
  Check(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  for (int i = 0; i < 200; ++i) empty_kernel<<<1, 1>>>();  // the runtime loads the module
  Check(cuCtxSynchronize(), "warm-up");

  std::vector<double> t[kWays];
  for (int r = 0; r < rounds; ++r)
    for (int w = 0; w < kWays; ++w)
      for (int i = 0; i < n; ++i) {
        auto t0 = Clock::now();
        empty_kernel<<<1, 1>>>();
        switch (w) {
          case kCtx: Check(cuCtxSynchronize(), "cuCtxSynchronize"); break;
          case kStream: Check(cuStreamSynchronize(nullptr), "cuStreamSynchronize"); break;
          case kEvent:
            Check(cuEventRecord(ev, nullptr), "cuEventRecord");
            Check(cuEventSynchronize(ev), "cuEventSynchronize");
            break;
          case kEventQuery: {
            Check(cuEventRecord(ev, nullptr), "cuEventRecord");
            CUresult q;
            while ((q = cuEventQuery(ev)) == CUDA_ERROR_NOT_READY) {}
            Check(q, "cuEventQuery");
            break;
          }
          case kStreamQuery: {
            CUresult q;
            while ((q = cuStreamQuery(nullptr)) == CUDA_ERROR_NOT_READY) {}
            Check(q, "cuStreamQuery");
            break;
          }
        }
        t[w].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
  std::printf("sched %-8s", flag);
  for (int w = 0; w < kWays; ++w) {
    std::sort(t[w].begin(), t[w].end());
    const size_t m = t[w].size();
    std::printf("  %s %.2f (%.2f-%.2f)", kNames[w], t[w][m / 2], t[w][m / 10], t[w][m * 9 / 10]);
  }
  std::printf("\n");
  return 0;
}
