#include "core/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/thread_pool.h"

namespace moeserve::trace {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/trace_test_" + std::to_string(getpid()) + "_" + name;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(TraceTest, RecordsNestedScopesAndEveryWorkersShareOfALoop) {
  ThreadPool pool(2, "test", 3);
  const std::string path = TempPath("loop.json");
  Start(path);
  ASSERT_TRUE(enabled());
  NameThisThread(3, "caller");
  {
    Scope outer("outer", "tokens", 7);
    EXPECT_STREQ(Scope::Current(), "outer");
    Scope inner("inner");
    EXPECT_STREQ(Scope::Current(), "inner");
    // Enough tasks that the worker takes part (each task waits a little).
    pool.ParallelFor(64, [](size_t, size_t) { usleep(200); });
  }
  EXPECT_EQ(Scope::Current(), nullptr);
  ASSERT_TRUE(Finish().ok());
  EXPECT_FALSE(enabled());

  const nlohmann::json trace = ReadJson(path);
  ASSERT_TRUE(trace["traceEvents"].is_array());
  double outer_ts = -1, outer_end = -1;
  int caller_tid = -1, worker_tid = -1, inner_events = 0, worker_events = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["args"]["name"] == "caller") caller_tid = e["tid"];
    if (e["ph"] == "M" && e["args"]["name"] == "test worker 1") worker_tid = e["tid"];
  }
  ASSERT_GE(caller_tid, 0);
  ASSERT_GE(worker_tid, 0);
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["pid"], 3);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    if (e["name"] == "outer") {
      EXPECT_EQ(e["tid"], caller_tid);
      EXPECT_EQ(e["args"]["tokens"], 7);
      outer_ts = e["ts"];
      outer_end = outer_ts + e["dur"].get<double>();
    }
    inner_events += e["name"] == "inner" && e["tid"] == caller_tid;
    worker_events += e["name"] == "inner" && e["tid"] == worker_tid;
  }
  EXPECT_EQ(inner_events, 1);
  EXPECT_EQ(worker_events, 1);  // the worker's share of the loop, named after the caller's scope
  EXPECT_GE(outer_ts, 0.0);
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "inner") {
      EXPECT_GE(e["ts"].get<double>(), outer_ts);
      EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), outer_end + 1e-3);
    }
  }
  EXPECT_EQ(trace["otherData"]["dropped_events"], 0);

  // Off again: scopes record nothing and a second Finish writes nothing.
  { Scope ignored("after"); }
  ASSERT_TRUE(Finish().ok());
  std::remove(path.c_str());
}

TEST(TraceTest, UnwritableFileIsAnErrorNamingIt) {
  Start("/nonexistent-dir/trace.json");
  { Scope s("step"); }
  const Status s = Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/trace.json"), std::string::npos) << s.message();
  EXPECT_FALSE(enabled());
}

}  // namespace
}  // namespace moeserve::trace
