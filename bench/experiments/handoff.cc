// Thread hand-off costs on this machine: what a spinning waiter pays to see a flag another
// thread sets, polling with sched_yield() (how tandem's spinning threads wait) against
// polling with the CPU's pause instruction, and the cost of sched_yield() itself.
//   g++ -O2 -pthread -o handoff bench/experiments/handoff.cc && ./handoff
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void Relax() { _mm_pause(); }
#else
static inline void Relax() { std::this_thread::yield(); }
#endif

using Clock = std::chrono::steady_clock;

static double P50(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Ping-pong through two atomics: the round trip's p50 / 2 is one hand-off.
template <class Wait>
static double HandOff(Wait wait, int rounds) {
  std::atomic<int> ping{0}, pong{0};
  std::thread echo([&] {
    for (int i = 1; i <= rounds; ++i) {
      while (ping.load(std::memory_order_acquire) != i) wait();
      pong.store(i, std::memory_order_release);
    }
  });
  std::vector<double> rt;
  rt.reserve(rounds);
  for (int i = 1; i <= rounds; ++i) {
    auto t0 = Clock::now();
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) wait();
    rt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  echo.join();
  return P50(rt) / 2;
}

// The worker's queue hand-off (Executor::Push / Loop): a 200 B message pushed under a mutex
// with notify_one and a ready flag; the consumer spins on the flag, then locks and pops.
// Round trip through two such queues, / 2.
struct Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<uint8_t>> q;
  std::atomic<bool> ready{false};
  void Push(std::vector<uint8_t> m) {
    std::lock_guard<std::mutex> l(mu);
    q.push_back(std::move(m));
    ready.store(true, std::memory_order_release);
    cv.notify_one();
  }
  template <class Wait>
  std::vector<uint8_t> Pop(Wait wait) {
    while (!ready.load(std::memory_order_acquire)) wait();
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return !q.empty(); });
    auto m = std::move(q.front());
    q.pop_front();
    ready.store(!q.empty(), std::memory_order_relaxed);
    return m;
  }
};

template <class Wait>
static double QueueHandOff(Wait wait, int rounds) {
  Queue a, b;
  std::thread echo([&] {
    for (int i = 0; i < rounds; ++i) b.Push(a.Pop(wait));
  });
  std::vector<double> rt;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    a.Push(std::vector<uint8_t>(200, 1));
    (void)b.Pop(wait);
    rt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  echo.join();
  return P50(rt) / 2;
}

int main() {
  const int n = 200000;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) sched_yield();
  const double yield_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) (void)Clock::now();
  const double now_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
  const double by_yield = HandOff([] { std::this_thread::yield(); }, 100000);
  const double by_pause = HandOff([] { Relax(); }, 100000);
  const double q_yield = QueueHandOff([] { std::this_thread::yield(); }, 100000);
  const double q_pause = QueueHandOff([] { Relax(); }, 100000);
  // What CUDA's TakeOutput pays per batch when nothing was printed: fflush + an empty pipe's read.
  int fds[2];
  if (pipe2(fds, O_NONBLOCK) != 0) return 1;
  char buf[256];
  t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    std::fflush(stdout);
    if (::read(fds[0], buf, sizeof buf) > 0) return 1;
  }
  const double drain_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
  std::printf("cores %u  sched_yield %.3f us  steady_clock::now %.3f us  empty drain %.3f us\n"
              "hand-off p50, flag: yield-spin %.3f us  pause-spin %.3f us; queue: yield-spin %.3f us  pause-spin %.3f us\n",
              std::thread::hardware_concurrency(), yield_us, now_us, drain_us, by_yield, by_pause, q_yield, q_pause);
}
