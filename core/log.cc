#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace moeserve {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};
thread_local int t_rank = 0;

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    case LogLevel::kError: return 'E';
    case LogLevel::kOff: return '-';
  }
  return '?';
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(level); }
LogLevel GetLogLevel() { return g_level.load(std::memory_order_relaxed); }
void SetLogRank(int rank) { t_rank = rank; }

bool ParseLogLevel(std::string_view name, LogLevel* level) {
  struct Entry {
    std::string_view name;
    LogLevel level;
  };
  static constexpr Entry kLevels[] = {{"debug", LogLevel::kDebug},
                                      {"info", LogLevel::kInfo},
                                      {"warning", LogLevel::kWarning},
                                      {"error", LogLevel::kError},
                                      {"off", LogLevel::kOff}};
  for (const Entry& e : kLevels) {
    if (e.name == name) {
      *level = e.level;
      return true;
    }
  }
  return false;
}

void LogLine(LogLevel level, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  // One fprintf per line so that lines of different threads do not interleave.
  std::fprintf(stderr, "[%02d:%02d:%02d.%03d %c r%d] %.*s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
               millis, LevelLetter(level), t_rank, static_cast<int>(message.size()),
               message.data());
}

}  // namespace moeserve
