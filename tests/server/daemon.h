// Runs a real tandemd as a child process for a test: its stderr goes to a log file, the
// address it listens on is read from that log, and it is killed (with its session
// workers, which die with it) when the fixture goes, or when the test process ends.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace tandem::test {

class Daemon {
 public:
  // Starts `tandemd --listen 127.0.0.1:0 <extra>`; empty address() when it did not start.
  explicit Daemon(std::vector<std::string> extra, const std::string& name = "tandemd") {
    static int started = 0;
    log_ = fmt::format("{}/{}-{}-{}.log", TANDEM_TEST_TMP, name, ::getpid(), ++started);
    std::remove(log_.c_str());  // so an old log's address is never read
    std::vector<std::string> args = {TANDEMD_PATH, "--listen", "127.0.0.1:0", "--backend", "opencl"};
    args.insert(args.end(), extra.begin(), extra.end());
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Dies with the test, also one that ends without its destructors (a watchdog's _Exit, a
      // crash): no server outlives it holding the test's output open. The signal follows the
      // thread that forks: Daemons are made on the test's main thread.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(125);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      FILE* f = std::fopen(log_.c_str(), "w");
      if (!f) ::_exit(126);
      ::dup2(fileno(f), STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // The log names the real port: "tandemd listening on 127.0.0.1:PORT ...".
    const std::regex re("listening on (127\\.0\\.0\\.1:[0-9]+)");
    for (int i = 0; i < 600 && address_.empty(); ++i) {
      std::smatch m;
      std::string text = Log();
      if (std::regex_search(text, m, re)) address_ = m[1];
      int status = 0;
      if (address_.empty() && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE(address_.empty()) << "tandemd did not start:\n" << Log();
  }
  ~Daemon() { Kill(); }
  // SIGKILL now (its session workers die with it); the log stays readable.
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  const std::string& address() const { return address_; }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  std::string address_;
};

}  // namespace tandem::test
