// launch_burst [N] [REPS]: REPS bursts of N empty-kernel launches, each followed by one
// cudaDeviceSynchronize. Prints, as medians over the bursts, what the program's thread paid
// per launch to post them and the whole burst (posts + synchronize) per launch: natively the
// second is the GPU's own launch rate; through Tandem it is the server's (with
// TANDEM_SERVER_PROFILE=1 TANDEM_LOG=info, tandemd logs its time per Launch at the session's end).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
__global__ void empty_kernel() {}
using Clock = std::chrono::steady_clock;
static double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 30;
  cudaFree(nullptr);
  empty_kernel<<<1, 1>>>();
  cudaDeviceSynchronize();
  std::vector<double> post, whole;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) empty_kernel<<<1, 1>>>();
    auto t1 = Clock::now();
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    auto t2 = Clock::now();
    post.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
    whole.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / n);
  }
  std::printf("burst of %d: post %.2f us per launch, whole %.2f us per launch\n", n, Median(post), Median(whole));
  return 0;
}
