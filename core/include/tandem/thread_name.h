// Names the calling thread as `top -H`, gdb, perf and /proc/PID/task/TID/comm show it. Every
// thread Tandem starts, in a program or in tandemd, is named "tdm-..." so that what a thread
// costs can be told apart from the program's own and from the GPU driver's threads.
#pragma once

#include <pthread.h>

#include <cstddef>

namespace tandem {

template <size_t N>
void NameThisThread(const char (&name)[N]) {
  // The kernel keeps 15 characters and the terminator; pthread_setname_np's only error for
  // the calling thread is ERANGE for a longer name, which this rules out.
  static_assert(N <= 16, "thread names are at most 15 characters");
  pthread_setname_np(pthread_self(), name);
}

}  // namespace tandem
