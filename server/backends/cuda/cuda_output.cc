// Capture of device printf output (see cuda_output.h).
#include "cuda_output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "tandem/thread_name.h"

namespace tandem::server::cuda {

Result<std::unique_ptr<OutputCapture>> OutputCapture::Start() {
  std::fflush(stdout);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return Status(Code::kInternal, fmt::format("cannot create the printf pipe: {}", std::strerror(errno)));
  // A larger pipe absorbs bursts between two drains; failing to grow it only costs wakeups.
  (void)::fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
  const int saved = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
  if (saved < 0 || ::dup2(fds[1], 1) < 0) {
    Status st(Code::kInternal, fmt::format("cannot redirect stdout for device printf: {}", std::strerror(errno)));
    if (saved >= 0) ::close(saved);
    ::close(fds[0]);
    ::close(fds[1]);
    return st;
  }
  ::close(fds[1]);  // fd 1 is now the pipe's only write end
  if (::fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0) {
    Status st(Code::kInternal, fmt::format("cannot make the printf pipe non-blocking: {}", std::strerror(errno)));
    ::dup2(saved, 1);
    ::close(saved);
    ::close(fds[0]);
    return st;
  }
  std::unique_ptr<OutputCapture> capture(new OutputCapture(fds[0], saved));
  capture->thread_ = std::thread([c = capture.get()] {
    NameThisThread("tdm-printf");
    c->Loop();
  });
  return capture;
}

OutputCapture::OutputCapture(int read_fd, int saved_stdout) : read_fd_(read_fd), saved_stdout_(saved_stdout) {}

OutputCapture::~OutputCapture() {
  std::fflush(stdout);
  ::dup2(saved_stdout_, 1);  // closes the pipe's write end: the drain sees the end
  ::close(saved_stdout_);
  stop_.store(true);
  thread_.join();
  ::close(read_fd_);
}

void OutputCapture::DrainLocked() {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(read_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EAGAIN: empty for now; 0: the write end is closed
    const size_t room = kMaxPending - std::min(kMaxPending, pending_.size());
    const size_t keep = std::min(room, static_cast<size_t>(n));
    pending_.append(buf, keep);
    dropped_ += static_cast<size_t>(n) - keep;
  }
}

// Reads as soon as output arrives, so the driver never blocks on a full pipe. Reads happen
// under the lock, so this thread and Take() cannot reorder chunks.
void OutputCapture::Loop() {
  while (!stop_.load()) {
    pollfd p{read_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, 200);
    if (r <= 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    DrainLocked();
    if ((p.revents & POLLHUP) && !(p.revents & POLLIN)) return;
  }
}

std::string OutputCapture::Take() {
  std::fflush(stdout);
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  std::string out;
  out.swap(pending_);
  if (dropped_) {
    out += fmt::format("\n[tandem: {} bytes of device output were dropped]\n", dropped_);
    dropped_ = 0;
  }
  return out;
}

}  // namespace tandem::server::cuda
