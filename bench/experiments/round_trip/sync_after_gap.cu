// sync_after_gap GAP_MS N: N idle cudaDeviceSynchronize round trips, each after sleeping GAP_MS.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
int main(int argc, char** argv) {
  const double gap = argc > 1 ? atof(argv[1]) : 0;
  const int n = argc > 2 ? atoi(argv[2]) : 1000;
  char* dev; cudaMalloc(&dev, 4096); cudaMemset(dev, 0, 4096); cudaDeviceSynchronize();
  char h[8];
  for (int r = 0; r < 50; ++r) cudaMemcpy(h, dev, 8, cudaMemcpyDeviceToHost);  // the copy path is "used"
  std::vector<double> t;
  for (int r = 0; r < n; ++r) {
    if (gap > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(gap));
    auto t0 = Clock::now();
    cudaDeviceSynchronize();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("gap %.1f ms: p50 %.1f us p90 %.1f\n", gap, t[t.size() / 2], t[9 * t.size() / 10]);
  return 0;
}
