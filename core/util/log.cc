#include "tandem/log.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace tandem::log {
namespace {
std::mutex g_mu;
std::string g_component = "tandem";

Level ParseLevel() {
  const char* v = std::getenv("TANDEM_LOG");
  if (!v) return Level::kWarn;
  if (!std::strcmp(v, "error")) return Level::kError;
  if (!std::strcmp(v, "info")) return Level::kInfo;
  if (!std::strcmp(v, "debug")) return Level::kDebug;
  return Level::kWarn;
}

// A switch variable: on when set, non-empty and not "0".
bool EnvOn(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}
}  // namespace

Level CurrentLevel() {
  static const Level level = ParseLevel();
  return level;
}

bool TraceEnabled() {
  static const bool on = EnvOn("TANDEM_TRACE");
  return on;
}

void SetComponent(std::string_view name) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_component = std::string(name);
}

void Write(Level level, std::string_view msg) {
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  // TANDEM_LOG_TIME=1: each line starts with CLOCK_MONOTONIC in microseconds, the same clock in
  // every process of a host, so a client's and its servers' traces line up.
  static const bool with_time = EnvOn("TANDEM_LOG_TIME");
  std::string stamp;
  if (with_time) {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    stamp = fmt::format("{}.{:06} ", ts.tv_sec, ts.tv_nsec / 1000);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::string line =
      fmt::format("{}[{} {} {}] {}\n", stamp, g_component, getpid(), kNames[static_cast<int>(level)], msg);
  // One write() per line so lines from several processes do not interleave.
  ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  (void)n;
}

void Once(std::string_view what) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.emplace(what).second) return;
  }
  Write(Level::kWarn, fmt::format("{} is not supported by Tandem", what));
}

}  // namespace tandem::log
