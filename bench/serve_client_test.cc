// The request side of bench serve without a server: SSE streams fed in arbitrary pieces give
// vLLM's TTFT / ITL / latency / usage, URLs and request bodies, and the arrival process.
#include "bench/serve_client.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/serve_benchmark.h"

namespace moeserve::bench {
namespace {

using nlohmann::json;

constexpr double kTol = 1e-12;

std::string Event(const json& j) { return "data: " + j.dump() + "\n\n"; }

json CompletionChunk(const std::string& text) {
  return {{"object", "text_completion"}, {"choices", {{{"index", 0}, {"text", text}}}}};
}
json ChatChunk(const json& delta) {
  return {{"object", "chat.completion.chunk"}, {"choices", {{{"index", 0}, {"delta", delta}}}}};
}
json UsageChunk(int completion_tokens) {
  return {{"choices", json::array()},
          {"usage", {{"prompt_tokens", 5}, {"completion_tokens", completion_tokens}}}};
}

TEST(StreamRecorderTest, CompletionsTimings) {
  StreamRecorder r(/*chat=*/false, /*start=*/10.0);
  const std::string first = Event(CompletionChunk("He"));
  // The first event arrives in two pieces; only the completed event counts, at its arrival.
  r.Feed(first.substr(0, 9), 10.1);
  r.Feed(first.substr(9), 10.2);
  r.Feed(Event(CompletionChunk("llo")) + Event(CompletionChunk("")), 10.5);  // one read, 2 chunks
  r.Feed(": a comment\n\n", 10.6);
  r.Feed(Event(CompletionChunk("!")), 10.9);
  r.Feed(Event(UsageChunk(4)), 11.5);  // usage: not a content chunk, latency stays
  r.Feed("data: [DONE]\n\n", 11.6);
  const RequestOutput o = std::move(r).Finish();
  EXPECT_TRUE(o.success) << o.error;
  EXPECT_EQ(o.start_time, 10.0);
  EXPECT_NEAR(o.ttft, 0.2, kTol);
  ASSERT_EQ(o.itl.size(), 3u);
  EXPECT_NEAR(o.itl[0], 0.3, kTol);
  EXPECT_NEAR(o.itl[1], 0.0, kTol);
  EXPECT_NEAR(o.itl[2], 0.4, kTol);
  EXPECT_NEAR(o.latency, 0.9, kTol);
  EXPECT_EQ(o.output_tokens, 4);
  EXPECT_EQ(o.generated_text, "Hello!");
}

TEST(StreamRecorderTest, ChatTimesTheRoleChunkAndEndsAtTheLastMessage) {
  StreamRecorder r(/*chat=*/true, 0.0);
  r.Feed(Event(ChatChunk({{"role", "assistant"}, {"content", ""}})), 0.5);  // TTFT, as vLLM
  r.Feed(Event(ChatChunk({{"content", "Hi"}})), 0.75);
  r.Feed(Event(ChatChunk(json::object())) /* finish_reason chunk */, 1.0);
  r.Feed(Event(UsageChunk(2)), 1.25);
  const RequestOutput o = std::move(r).Finish();
  EXPECT_TRUE(o.success);
  EXPECT_NEAR(o.ttft, 0.5, kTol);
  EXPECT_EQ(o.itl, (std::vector<double>{0.25, 0.25}));
  EXPECT_NEAR(o.latency, 1.25, kTol);  // the usage message moves a chat's end, as vLLM's client
  EXPECT_EQ(o.output_tokens, 2);
  EXPECT_EQ(o.generated_text, "Hi");
}

TEST(StreamRecorderTest, CrLfEventsAndMultiLineData) {
  StreamRecorder r(false, 0.0);
  r.Feed("data: {\"choices\": [{\"text\": \"a\"}]}\r\n\r\n", 1.0);
  r.Feed("event: x\ndata: {\"choices\":\ndata: [{\"text\": \"b\"}]}\n\n", 2.0);
  const RequestOutput o = std::move(r).Finish();
  EXPECT_TRUE(o.success) << o.error;
  EXPECT_EQ(o.generated_text, "ab");
  EXPECT_EQ(o.itl, (std::vector<double>{1.0}));
}

TEST(StreamRecorderTest, FailuresAreRecorded) {
  {
    StreamRecorder r(false, 0.0);
    r.Feed(Event(UsageChunk(0)) + "data: [DONE]\n\n", 1.0);
    const RequestOutput o = std::move(r).Finish();
    EXPECT_FALSE(o.success);
    EXPECT_NE(o.error.find("no TTFT"), std::string::npos);
  }
  {
    StreamRecorder r(false, 0.0);
    r.Feed(Event(CompletionChunk("a")), 1.0);
    r.Feed(Event({{"error", {{"message", "engine died"}, {"code", 500}}}}), 2.0);
    const RequestOutput o = std::move(r).Finish();
    EXPECT_FALSE(o.success);
    EXPECT_NE(o.error.find("engine died"), std::string::npos);
  }
  {
    StreamRecorder r(false, 0.0);
    r.Feed("data: {not json\n\n", 1.0);
    EXPECT_FALSE(std::move(r).Finish().success);
  }
}

TEST(ParseBaseUrlTest, HostPortPrefix) {
  Result<BaseUrl> b = ParseBaseUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "127.0.0.1");
  EXPECT_EQ(b->port, 8000);
  EXPECT_EQ(b->path_prefix, "");
  b = ParseBaseUrl("http://example.com/api/");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "example.com");
  EXPECT_EQ(b->port, 80);
  EXPECT_EQ(b->path_prefix, "/api");
  EXPECT_EQ(b->text, "http://example.com/api");
  b = ParseBaseUrl("http://[::1]:9000");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 9000);
  b = ParseBaseUrl("https://secure.example");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->scheme, "https");
  EXPECT_EQ(b->port, 443);
  for (const char* bad : {"127.0.0.1:8000", "ftp://x", "http://", "http://h:0", "http://h:99999",
                          "http://h:8a", "http://[::1"}) {
    Result<BaseUrl> r = ParseBaseUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--base-url"), std::string::npos) << bad;
  }
}

TEST(RequestBodyTest, StreamsWithUsageAndMergesExtra) {
  ClientOptions o;
  o.model = "m";
  o.ignore_eos = true;
  o.extra_body = R"({"temperature": 0.0, "top_k": 5})";
  json j = json::parse(RequestBody(o, "hello", 7));
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["prompt"], "hello");
  EXPECT_EQ(j["max_tokens"], 7);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["top_k"], 5);
  o.endpoint = "/v1/chat/completions";
  o.ignore_eos = false;
  j = json::parse(RequestBody(o, "hello", 7));
  EXPECT_EQ(j["messages"], json::parse(R"([{"role": "user", "content": "hello"}])"));
  EXPECT_EQ(j["max_completion_tokens"], 7);
  EXPECT_FALSE(j.contains("prompt"));
  EXPECT_FALSE(j.contains("ignore_eos"));
}

TEST(ArrivalTimesTest, InfiniteRateSendsEverythingAtOnce) {
  EXPECT_EQ(ArrivalTimes(3, std::numeric_limits<double>::infinity(), 1.0, 0),
            (std::vector<double>{0, 0, 0}));
}

TEST(ArrivalTimesTest, PoissonScaledToNOverRate) {
  const std::vector<double> t = ArrivalTimes(100, 4.0, 1.0, 7);
  ASSERT_EQ(t.size(), 100u);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_GT(t[0], 0);
  EXPECT_NEAR(t.back(), 25.0, 1e-9);
  EXPECT_EQ(t, ArrivalTimes(100, 4.0, 1.0, 7));
  EXPECT_NE(t, ArrivalTimes(100, 4.0, 1.0, 8));
  // Poisson gaps are irregular; burstiness -> infinity makes them constant.
  const std::vector<double> even = ArrivalTimes(4, 2.0, std::numeric_limits<double>::infinity(), 7);
  ASSERT_EQ(even.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(even[i], 0.5 * (i + 1), 1e-12);
}

TEST(InFlightLimitTest, ConcurrencyOrCap) {
  EXPECT_EQ(InFlightLimit(100, 4), 4);
  EXPECT_EQ(InFlightLimit(3, 4), 3);
  EXPECT_EQ(InFlightLimit(10, std::nullopt), 10);
  EXPECT_LE(InFlightLimit(100000, std::nullopt), kMaxThreads);
}

}  // namespace
}  // namespace moeserve::bench
