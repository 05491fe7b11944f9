#include "core/memory_info.h"

#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace moeserve {

int64_t ParseMemAvailable(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  for (size_t start = 0; start < meminfo.size();) {
    size_t end = meminfo.find('\n', start);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(start, end - start);
    start = end + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    // "MemAvailable:   21930628 kB"
    line.remove_prefix(kKey.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    int64_t kib = 0;
    const auto [rest, error] = std::from_chars(line.data(), line.data() + line.size(), kib);
    const std::string_view unit(rest, line.data() + line.size() - rest);
    if (error != std::errc() || kib < 0 || unit != " kB" ||
        kib > std::numeric_limits<int64_t>::max() / 1024) {
      return 0;
    }
    return kib * 1024;
  }
  return 0;
}

int64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  return ParseMemAvailable(text.str());
}

}  // namespace moeserve
