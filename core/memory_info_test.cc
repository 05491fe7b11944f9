#include "core/memory_info.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(MemoryInfoTest, ParsesMemAvailable) {
  EXPECT_EQ(ParseMemAvailable("MemTotal:       24576000 kB\n"
                              "MemFree:        16000000 kB\n"
                              "MemAvailable:   21930628 kB\n"
                              "Buffers:          123456 kB\n"),
            int64_t{21930628} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 0 kB"), 0);  // no newline at the end
}

TEST(MemoryInfoTest, HostileTextGivesUnknown) {
  for (const char* text :
       {"", "MemTotal: 100 kB\n", "MemAvailable:\n", "MemAvailable: -5 kB\n",
        "MemAvailable: 12 MB\n", "MemAvailable: 12kB\n", "MemAvailable: 99999999999999999999 kB\n",
        "MemAvailable: 9223372036854775807 kB\n", "XMemAvailable: 5 kB\n",
        "MemAvailable: 5 kB trailing\n"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(ParseMemAvailable(text), 0);
  }
}

TEST(MemoryInfoTest, ThisMachineHasSome) {
  // Every Linux since 3.14 has the line; the suite runs on Linux.
  EXPECT_GT(AvailableMemoryBytes(), 0);
}

}  // namespace
}  // namespace moeserve
