// How far a keepalive can take the idle read-back, natively (no Tandem): the main thread waits
// a gap (busy-waiting, or sleeping with "sleep"), then times an 8 B device-to-host copy into
// pinned memory on its own stream, as tandemd reads. A background thread meanwhile copies 8 B
// every 1 ms: not at all ("none"), from another device buffer into another host buffer
// ("other"), from the same device buffer ("same-dev"), or between the same two buffers
// ("same-both"). Prints the p50 in us after 0, 1, 5, 20 and 100 ms.
//   nvcc -O2 -o /tmp/native_keepalive bench/experiments/native_keepalive.cu
//   for m in none other same-dev same-both same-stream; do /tmp/native_keepalive $m; /tmp/native_keepalive $m sleep; done
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
static void spin(double ms) { auto until = Clock::now() + std::chrono::duration<double, std::milli>(ms); while (Clock::now() < until) {} }
int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "none";
  const bool sleep_main = argc > 2 && !strcmp(argv[2], "sleep");
  const double period_ms = argc > 3 ? std::atof(argv[3]) : 1.0;
  char *A, *B, *hp, *hp2;
  cudaMalloc(&A, 1 << 20); cudaMalloc(&B, 1 << 20); cudaMemset(A, 1, 1 << 20); cudaMemset(B, 2, 1 << 20);
  cudaHostAlloc(&hp, 4096, 0); cudaHostAlloc(&hp2, 4096, 0);
  cudaStream_t s1, s2; cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaDeviceSynchronize();
  std::atomic<bool> stop{false};
  std::thread bg([&] {
    if (!strcmp(mode, "none")) return;
    char* src = !strcmp(mode, "other") ? B : A;
    char* dst = !strcmp(mode, "same-both") ? hp : hp2;
    cudaStream_t s = !strcmp(mode, "same-stream") ? s1 : s2;
    while (!stop) {
      cudaMemcpyAsync(dst, src, 8, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(period_ms));
    }
  });
  const double gaps[] = {0, 1, 5, 20, 100};
  std::printf("%s%s/%gms:", mode, sleep_main ? "/sleep" : "", period_ms);
  for (double g : gaps) {
    std::vector<double> t;
    for (int r = 0; r < (g == 0 ? 500 : g < 50 ? 100 : 30); ++r) {
      if (g > 0) { if (sleep_main) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(g)); else spin(g); }
      auto t0 = Clock::now();
      cudaMemcpyAsync(hp, A, 8, cudaMemcpyDeviceToHost, s1); cudaStreamSynchronize(s1);
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    std::printf("  %gms %.1f", g, t[t.size() / 2]);
  }
  std::printf("\n");
  stop = true; bg.join();
  return 0;
}
