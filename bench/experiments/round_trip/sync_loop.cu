// sync_loop idle|launch|read: 3000 synchronous round trips of one kind (median printed).
// sync_loop async: 30 times 1000 launches and one synchronize, per launch (as cuda_bench's
// cuda_launch_async).
// sync_loop split: launch + synchronize, the launch call and the synchronize call timed apart.
// A second argument sets the number of round trips (of bursts, for async), e.g. for a profile.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
__global__ void empty_kernel() {}
using Clock = std::chrono::steady_clock;
int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "idle";
  char* dev; cudaMalloc(&dev, 4096); cudaMemset(dev, 0, 4096); cudaDeviceSynchronize();
  std::vector<double> t; char h[8];
  const bool async = !strcmp(mode, "async");
  if (!strcmp(mode, "split")) {
    std::vector<double> l, y, b;
    for (int r = 0; r < 3000; ++r) {
      auto t0 = Clock::now();
      empty_kernel<<<1, 1>>>();
      auto t1 = Clock::now();
      cudaDeviceSynchronize();
      auto t2 = Clock::now();
      l.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      y.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      b.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
    }
    for (auto* v : {&l, &y, &b}) std::sort(v->begin(), v->end());
    std::printf("split: p50 %.1f us (launch call %.2f, synchronize call %.2f)\n", b[1500], l[1500], y[1500]);
    return 0;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : (async ? 30 : 3000);
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    if (async) { for (int i = 0; i < 1000; ++i) empty_kernel<<<1, 1>>>(); cudaDeviceSynchronize(); }
    else if (!strcmp(mode, "launch")) { empty_kernel<<<1, 1>>>(); cudaDeviceSynchronize(); }
    else if (!strcmp(mode, "read")) cudaMemcpy(h, dev, 8, cudaMemcpyDeviceToHost);
    else cudaDeviceSynchronize();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (async ? 1000 : 1));
  }
  std::sort(t.begin(), t.end());
  std::printf("%s: p50 %.1f us p10 %.1f p90 %.1f\n", mode, t[t.size() / 2], t[t.size() / 10], t[9 * t.size() / 10]);
  return 0;
}
