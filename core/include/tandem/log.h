// Minimal logging on stderr, formatted with fmt. TANDEM_LOG=error|warn|info|debug picks
// the level (default warn); TANDEM_TRACE=1 turns on the per-command trace.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace tandem::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

Level CurrentLevel();
bool TraceEnabled();
void Write(Level level, std::string_view msg);
// Logs `what` once per process (used for unsupported API entry points).
void Once(std::string_view what);
// Sets the component name printed in every line ("tandemd", "client", ...).
void SetComponent(std::string_view name);

template <class... A>
void Error(fmt::format_string<A...> f, A&&... a) {
  Write(Level::kError, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void Warn(fmt::format_string<A...> f, A&&... a) {
  if (CurrentLevel() >= Level::kWarn) Write(Level::kWarn, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void Info(fmt::format_string<A...> f, A&&... a) {
  if (CurrentLevel() >= Level::kInfo) Write(Level::kInfo, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void Debug(fmt::format_string<A...> f, A&&... a) {
  if (CurrentLevel() >= Level::kDebug) Write(Level::kDebug, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void Trace(fmt::format_string<A...> f, A&&... a) {
  if (TraceEnabled()) Write(Level::kInfo, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace tandem::log
