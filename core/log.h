// Logging: one line per message to stderr, "[14:02:11.123 I r0] message".
// Usage: LogInfo("loaded {} tensors from {}", n, path);
#pragma once

#include <string_view>

#include <fmt/format.h>

namespace moeserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// The rank shown in each line of this thread's messages (ranks are threads or processes).
void SetLogRank(int rank);
// Parses "debug" | "info" | "warning" | "error" | "off".
bool ParseLogLevel(std::string_view name, LogLevel* level);

void LogLine(LogLevel level, std::string_view message);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < GetLogLevel()) return;
  LogLine(level, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void LogDebug(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kDebug, f, std::forward<Args>(args)...);
}
template <typename... Args>
void LogInfo(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kInfo, f, std::forward<Args>(args)...);
}
template <typename... Args>
void LogWarning(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kWarning, f, std::forward<Args>(args)...);
}
template <typename... Args>
void LogError(fmt::format_string<Args...> f, Args&&... args) {
  Log(LogLevel::kError, f, std::forward<Args>(args)...);
}

}  // namespace moeserve
