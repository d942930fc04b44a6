// TANDEM_SERVER_PROFILE=1: named durations (count, total, mean, max), logged as "profile:"
// lines, largest total first. The session's per-command times and its asynchronous
// completions use one; a backend's own threads (the OpenCL event watcher) another.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/log.h"

namespace tandem::server {

class Profile {
 public:
  using Clock = std::chrono::steady_clock;
  // A profile when TANDEM_SERVER_PROFILE=1, else null (callers test the pointer).
  static std::shared_ptr<Profile> FromEnv() {
    const char* v = std::getenv("TANDEM_SERVER_PROFILE");
    return v && std::string_view(v) == "1" ? std::make_shared<Profile>() : nullptr;
  }
  // Thread-safe.
  void Add(const std::string& what, Clock::duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[what];
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    ++e.count;
    e.total_ns += ns;
    e.max_ns = std::max<int64_t>(e.max_ns, ns);
  }
  void Log() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, Entry>> rows(entries_.begin(), entries_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.total_ns > b.second.total_ns; });
    for (const auto& [what, e] : rows)
      log::Info("profile: {:<28} {:>8} x  total {:>10.3f} ms  mean {:>9.1f} us  max {:>9.1f} us", what, e.count,
                e.total_ns / 1e6, e.total_ns / 1e3 / e.count, e.max_ns / 1e3);
  }

 private:
  struct Entry {
    uint64_t count = 0;
    int64_t total_ns = 0, max_ns = 0;
  };
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace tandem::server
