#include "core/log.h"

#include <gtest/gtest.h>

#include <regex>

#include "core/timer.h"

namespace moeserve {
namespace {

TEST(LogTest, LineHasTimeLevelRankAndMessage) {
  SetLogLevel(LogLevel::kInfo);
  SetLogRank(3);
  testing::internal::CaptureStderr();
  LogInfo("loaded {} tensors from {}", 12, "model.safetensors");
  LogWarning("slow");
  LogDebug("hidden at info level");
  const std::string err = testing::internal::GetCapturedStderr();
  SetLogRank(0);
  EXPECT_TRUE(std::regex_search(
      err, std::regex(R"(^\[\d\d:\d\d:\d\d\.\d\d\d I r3\] loaded 12 tensors from model\.safetensors\n)")))
      << err;
  EXPECT_NE(err.find("W r3] slow\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("hidden"), std::string::npos) << err;
}

TEST(LogTest, LevelsParseAndFilter) {
  LogLevel level;
  ASSERT_TRUE(ParseLogLevel("debug", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  ASSERT_TRUE(ParseLogLevel("off", &level));
  EXPECT_FALSE(ParseLogLevel("verbose", &level));
  SetLogLevel(LogLevel::kOff);
  testing::internal::CaptureStderr();
  LogError("nothing");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  SetLogLevel(LogLevel::kInfo);
}

TEST(TimerTest, StopwatchIsMonotonic) {
  Stopwatch watch;
  const int64_t a = watch.ElapsedNanos();
  const int64_t b = watch.ElapsedNanos();
  EXPECT_GE(a, 0);
  EXPECT_GE(b, a);
  watch.Reset();
  EXPECT_GE(watch.ElapsedSeconds(), 0.0);
}

}  // namespace
}  // namespace moeserve
