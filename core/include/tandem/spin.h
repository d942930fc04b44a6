// Busy-waiting for a hand-over between threads: the fabric's progress and receive threads,
// the worker's executor and waiter, a client waiting for its reply.
#pragma once

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tandem {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Polls `done` until it holds (true) or `until` passes (false). Between polls the core
// pauses; every kPollsPerYield polls (a few microseconds) it is offered to other threads,
// so a spinner never keeps the thread it waits for off a small machine's cores. Polling
// with sched_yield alone costs a system call per look, which on a VM is most of a
// hand-over between two spinning threads.
template <class Done, class TimePoint>
bool SpinUntil(Done&& done, TimePoint until) {
  constexpr int kPollsPerYield = 64;
  for (;;) {
    for (int i = 0; i < kPollsPerYield; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (TimePoint::clock::now() >= until) return done();
    std::this_thread::yield();
  }
}

}  // namespace tandem
