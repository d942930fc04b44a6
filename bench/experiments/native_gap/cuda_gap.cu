// cuda_gap MODE GAP_US [N]: N empty-kernel launch + cudaDeviceSynchronize round trips, natively,
// with GAP_US between them spent as MODE says (b2b, spin, sleep: as ocl_gap.c); prints the p50
// of the launch + synchronize alone. SPINNERS=K: K more threads spin (pause) throughout.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
__global__ void empty_kernel() {}
using Clock = std::chrono::steady_clock;
static double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}
int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const char* mode = argv[1];
  const double gap_us = atof(argv[2]);
  const int n = argc > 3 ? atoi(argv[3]) : 3000;
  if (strcmp(mode, "b2b") && strcmp(mode, "spin") && strcmp(mode, "sleep")) return 2;
  if (cudaFree(nullptr) != cudaSuccess) return 1;
  const int spinners = getenv("SPINNERS") ? atoi(getenv("SPINNERS")) : 0;
  std::atomic<bool> quit{false};
  std::vector<std::thread> spin;
  for (int i = 0; i < spinners; ++i)
    spin.emplace_back([&quit] {
      while (!quit.load()) __builtin_ia32_pause();
    });
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    if (!strcmp(mode, "spin")) {
      auto g0 = Clock::now();
      while (us_since(g0) < gap_us) {
      }
    } else if (!strcmp(mode, "sleep") && gap_us > 0) {
      timespec ts{0, static_cast<long>(gap_us * 1000)};
      nanosleep(&ts, nullptr);
    }
    auto t0 = Clock::now();
    empty_kernel<<<1, 1>>>();
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    t.push_back(us_since(t0));
  }
  quit = true;
  for (auto& th : spin) th.join();
  std::sort(t.begin(), t.end());
  std::printf("cuda   %-6s spinners %d gap %5.0f us: p50 %.1f us p10 %.1f p90 %.1f\n", mode, spinners, gap_us, t[t.size() / 2],
              t[t.size() / 10], t[9 * t.size() / 10]);
  return 0;
}
