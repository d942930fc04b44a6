// Waiting a moment for another thread without sleeping: the CPU's pause instruction between
// looks, and sched_yield only now and then (on a few cores the thread being waited for may
// need this one). On the H100 VM a thread that yielded on every look made the tcp round trip
// of the thread polling beside it 10-15 us slower (bench/results/2026-11-26-e.md).
#pragma once

#include <thread>

namespace tandem {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// One look's pause: for (SpinPause p; !ready(); p.Once()) {}
class SpinPause {
 public:
  void Once() {
    if (++looks_ % kYieldEvery == 0) std::this_thread::yield();
    else CpuRelax();
  }

 private:
  static constexpr unsigned kYieldEvery = 256;  // some 5-20 us of pauses
  unsigned looks_ = 0;
};

}  // namespace tandem
