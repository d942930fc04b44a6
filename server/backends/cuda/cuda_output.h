// Device printf: the driver writes it to the process's stdout (fd 1) at sync points. The
// capture points fd 1 at a pipe and keeps draining it on a thread (a full pipe would block
// the driver inside a synchronize); Take() hands out what arrived so far, in order.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tandem/status.h"

namespace tandem::server::cuda {

class OutputCapture {
 public:
  // Output kept between two Take() calls at most; beyond it the rest is counted and dropped.
  static constexpr size_t kMaxPending = 64u << 20;

  // Redirects fd 1. tandemd logs on stderr, which stays where it was.
  static Result<std::unique_ptr<OutputCapture>> Start();
  ~OutputCapture();  // puts fd 1 back and stops the drain thread

  // Everything written to fd 1 since the last call (libc's stdout buffer flushed first).
  std::string Take();

 private:
  OutputCapture(int read_fd, int saved_stdout);
  void DrainLocked();  // reads what the pipe holds now; mu_ held
  void Loop();

  int read_fd_;
  int saved_stdout_;
  std::mutex mu_;
  std::string pending_;
  size_t dropped_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tandem::server::cuda
