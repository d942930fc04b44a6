// What the OpenCL end-to-end tests share: tandemd processes on 127.0.0.1 (OpenCL backend
// over the machine's own platform, PoCL here) and pointing the ICD loader at Tandem.
#pragma once

#include <CL/cl.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tandem_test {

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One tandemd for this process, in its own session so its workers die with it.
class Server {
 public:
  // Starts tandemd and waits for its "listening" line; returns "" or why it failed.
  std::string Start() {
    // The server must see the machine's own OpenCL platforms, never Tandem's.
    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e) {
      std::string v(*e);
      if (v.starts_with("OCL_ICD_VENDORS=") || v.starts_with("TANDEM_SERVERS=")) continue;
      env_store.push_back(v);
    }
    std::vector<char*> env;
    for (auto& v : env_store) env.push_back(v.data());
    env.push_back(nullptr);
    std::string why;
    for (int attempt = 0; attempt < 3; ++attempt) {
      address_ = "127.0.0.1:" + std::to_string(FreePort());
      static int serial = 0;
      log_ = "/tmp/tandem-opencl-e2e-" + std::to_string(getpid()) + "-" + std::to_string(serial++) + ".log";
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&fa, 1, 2);
      posix_spawnattr_t attr;
      posix_spawnattr_init(&attr);
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
      std::string listen = address_;
      char* argv[] = {const_cast<char*>(TANDEMD), const_cast<char*>("--listen"), listen.data(),
                      const_cast<char*>("--backend"), const_cast<char*>("opencl"), nullptr};
      int rc = posix_spawn(&pid_, TANDEMD, &fa, &attr, argv, env.data());
      posix_spawn_file_actions_destroy(&fa);
      posix_spawnattr_destroy(&attr);
      if (rc != 0) return std::string("posix_spawn ") + TANDEMD + ": " + strerror(rc);
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < deadline) {
        if (ReadFile(log_).find("listening") != std::string::npos) return "";
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = 0;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      why = "tandemd did not start on " + address_ + ":\n" + ReadFile(log_);
      Stop();
    }
    return why;
  }
  void Stop() {
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = 0;
    }
  }
  const std::string& address() const { return address_; }
  std::string log() const { return ReadFile(log_); }

 private:
  pid_t pid_ = 0;
  std::string address_, log_;
};

// Ends the process when one test has run for TANDEM_TEST_WATCHDOG_S (default 90 s, under
// ctest's timeout), printing the test's name and `context()` (the servers' logs) first, so a
// hang says where it was instead of only "Timeout"; `stop()` then ends the servers (exit
// handlers are skipped: the client's would wait on the hung session).
class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  static void Install(std::function<std::string()> context, std::function<void()> stop) {
    static Watchdog* dog = nullptr;
    if (dog) return;
    dog = new Watchdog(std::move(context), std::move(stop));  // lives until exit, as gtest's listeners do
    ::testing::UnitTest::GetInstance()->listeners().Append(dog);
    std::thread([] { dog->Watch(); }).detach();
  }

 private:
  Watchdog(std::function<std::string()> context, std::function<void()> stop)
      : context_(std::move(context)), stop_(std::move(stop)) {
    const char* v = std::getenv("TANDEM_TEST_WATCHDOG_S");
    if (v && std::atoi(v) > 0) limit_ = std::chrono::seconds(std::atoi(v));
  }
  void OnTestStart(const ::testing::TestInfo& t) override {
    std::lock_guard<std::mutex> lock(mu_);
    name_ = std::string(t.test_suite_name()) + "." + t.name();
    started_ = std::chrono::steady_clock::now();
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mu_);
    name_.clear();
  }
  void Watch() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::lock_guard<std::mutex> lock(mu_);
      if (name_.empty() || std::chrono::steady_clock::now() - started_ < limit_) continue;
      fprintf(stderr, "watchdog: %s has run for %lld s; giving up. %s\n", name_.c_str(),
              static_cast<long long>(limit_.count()), context_().c_str());
      fflush(stderr);
      stop_();
      std::_Exit(3);
    }
  }

  std::function<std::string()> context_;
  std::function<void()> stop_;
  std::chrono::seconds limit_{90};
  std::mutex mu_;
  std::string name_;
  std::chrono::steady_clock::time_point started_;
};

// The Tandem platform, as the loader lists it.
inline cl_platform_id TandemPlatform() {
  cl_uint n = 0;
  if (clGetPlatformIDs(0, nullptr, &n) != CL_SUCCESS || n == 0) return nullptr;
  std::vector<cl_platform_id> ps(n);
  clGetPlatformIDs(n, ps.data(), nullptr);
  for (cl_platform_id p : ps) {
    char name[64] = {};
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof name, name, nullptr);
    if (std::string(name) == "Tandem") return p;
  }
  return nullptr;
}

// The loader reads its variables once per process.
inline bool g_loader_pointed = false;

inline void PointLoaderAtTandem(const std::string& servers) {
  g_loader_pointed = true;
  setenv("TANDEM_SERVERS", servers.c_str(), 1);
  setenv("OCL_ICD_VENDORS", TANDEM_ICD_DIR, 1);
  // The Khronos loader (CUDA ships one, first in the GPU machine's library cache) ignores
  // OCL_ICD_VENDORS and loads exactly OCL_ICD_FILENAMES: name Tandem's library there too.
  std::ifstream icd(std::string(TANDEM_ICD_DIR) + "/tandem.icd");
  std::string library;
  std::getline(icd, library);
  setenv("OCL_ICD_FILENAMES", library.c_str(), 1);
  setenv("TANDEM_CONNECT_TIMEOUT_MS", "5000", 1);
}

}  // namespace tandem_test
