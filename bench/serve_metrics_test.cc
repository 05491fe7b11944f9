// vLLM's calculate_metrics on small hand-computed runs: per-request TTFT/TPOT/E2EL, per-chunk
// ITL, numpy percentiles, throughputs, goodput and the 1-second bucket maxima; and the summary
// and result JSON keys.
#include "bench/serve_metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace moeserve::bench {
namespace {

using nlohmann::json;

RequestOutput Ok(double start, double ttft, std::vector<double> itl, double latency,
                 int64_t output_tokens, int64_t prompt_len) {
  RequestOutput o;
  o.success = true;
  o.start_time = start;
  o.ttft = ttft;
  o.itl = std::move(itl);
  o.latency = latency;
  o.output_tokens = output_tokens;
  o.prompt_len = prompt_len;
  return o;
}

RequestOutput Failed(int64_t prompt_len) {
  RequestOutput o;
  o.error = "HTTP 500";
  o.prompt_len = prompt_len;
  return o;
}

// A: 4 tokens, TPOT (0.3 - 0.1) / 3; B: 1 token (no TPOT); C: failed; D: 3 tokens, TPOT 0.2.
std::vector<RequestOutput> SampleRun() {
  return {Ok(0.0, 0.1, {0.05, 0.05, 0.1}, 0.3, 4, 10), Ok(0.5, 0.2, {}, 0.2, 1, 20), Failed(30),
          Ok(1.2, 0.3, {0.1, 0.3}, 0.7, 3, 5)};
}

constexpr double kTol = 1e-9;

TEST(PercentileTest, IsNumpyLinear) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 25), 1.75);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile({4, 1, 3, 2}, 100), 4);
  EXPECT_NEAR(Percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99), 9.91, kTol);
}

TEST(ComputeStatsTest, MeanMedianPopulationStdInMs) {
  const MetricStats s = ComputeStats({0.1, 0.2, 0.3}, {50, 99});
  EXPECT_NEAR(s.mean_ms, 200, kTol);
  EXPECT_NEAR(s.median_ms, 200, kTol);
  EXPECT_NEAR(s.std_ms, 81.64965809277261, 1e-9);  // sqrt(0.02 / 3), ddof 0
  ASSERT_EQ(s.percentiles_ms.size(), 2u);
  EXPECT_EQ(s.percentiles_ms[1].first, 99);
  EXPECT_NEAR(s.percentiles_ms[1].second, 298, kTol);
  const MetricStats empty = ComputeStats({}, {99});
  EXPECT_EQ(empty.mean_ms, 0);
  EXPECT_EQ(empty.std_ms, 0);
  EXPECT_EQ(empty.percentiles_ms[0].second, 0);
}

TEST(CalculateMetricsTest, HandComputedRun) {
  const BenchmarkMetrics m = CalculateMetrics(SampleRun(), 2.0, {99}, {});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 35);  // the failed request's prompt does not count
  EXPECT_EQ(m.total_output, 8);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 1, 0, 3}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 4);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 21.5);
  EXPECT_EQ(m.request_goodput, 0);

  EXPECT_NEAR(m.ttft.mean_ms, 200, kTol);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 298, kTol);
  // TPOT only for output_len > 1: A 66.67 ms, D 200 ms.
  EXPECT_NEAR(m.tpot.mean_ms, 400.0 / 3, kTol);
  EXPECT_NEAR(m.tpot.median_ms, 400.0 / 3, kTol);
  EXPECT_NEAR(m.tpot.std_ms, 200.0 / 3, kTol);
  EXPECT_NEAR(m.tpot.percentiles_ms[0].second, 200 - 0.01 * 400.0 / 3, kTol);
  // ITL: every chunk gap of every request, [50, 50, 100, 100, 300] ms.
  EXPECT_NEAR(m.itl.mean_ms, 120, kTol);
  EXPECT_NEAR(m.itl.median_ms, 100, kTol);
  EXPECT_NEAR(m.itl.percentiles_ms[0].second, 292, kTol);
  EXPECT_NEAR(m.e2el.mean_ms, 400, kTol);
  EXPECT_NEAR(m.e2el.median_ms, 300, kTol);

  // Buckets from t = 0: chunks of A (0.1, 0.15, 0.2, 0.3) and B (0.7) in second 0, D's (1.5,
  // 1.6, 1.9) in second 1; A and B in flight in second 0, D alone in second 1.
  EXPECT_EQ(m.max_output_tokens_per_s, 5);
  EXPECT_EQ(m.max_concurrent_requests, 2);
}

TEST(CalculateMetricsTest, BucketsCountARequestInEverySecondItSpans) {
  // Seconds counted from the first send (0.5). A runs from 0 to 2.0 with chunks at 0.1, 1.1, 2.0;
  // B from 1.1 to 1.3 (chunks 1.2, 1.3); C from 1.0 to 1.3 (chunks 1.1, 1.2, 1.3).
  const BenchmarkMetrics m =
      CalculateMetrics({Ok(0.5, 0.1, {1.0, 0.9}, 2.0, 3, 1), Ok(1.6, 0.1, {0.1}, 0.2, 2, 1),
                        Ok(1.5, 0.1, {0.1, 0.1}, 0.3, 3, 1)},
                       3.0, {99}, {});
  EXPECT_EQ(m.max_output_tokens_per_s, 6);  // second 1: one of A's, two of B's, three of C's
  EXPECT_EQ(m.max_concurrent_requests, 3);  // second 1: A, B and C
}

TEST(CalculateMetricsTest, GoodputCountsRequestsMeetingEverySlo) {
  const auto goodput = [](const std::string& slo) {
    Result<GoodputSlo> g = ParseGoodput(slo);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return CalculateMetrics(SampleRun(), 2.0, {99}, *g).request_goodput;
  };
  EXPECT_DOUBLE_EQ(goodput("ttft:250"), 1.0);                    // A, B
  EXPECT_DOUBLE_EQ(goodput("ttft:200"), 1.0);                    // inclusive
  EXPECT_DOUBLE_EQ(goodput("tpot:100"), 1.0);                    // A (66.7), B (1 token: TPOT 0)
  EXPECT_DOUBLE_EQ(goodput("ttft:150 tpot:100"), 0.5);           // A
  EXPECT_DOUBLE_EQ(goodput("e2el:250"), 0.5);                    // B
  EXPECT_DOUBLE_EQ(goodput("ttft:1e9,tpot:1e9,e2el:1e9"), 1.5);  // every completed request
  EXPECT_DOUBLE_EQ(goodput("tpot:0"), 0.5);                      // only B, whose TPOT is 0
  EXPECT_DOUBLE_EQ(goodput("ttft:0.001"), 0);
}

TEST(CalculateMetricsTest, OneTokenRequestsHaveNoTpot) {
  const BenchmarkMetrics m = CalculateMetrics({Ok(0, 0.1, {}, 0.1, 1, 3)}, 1.0, {99}, {});
  EXPECT_EQ(m.completed, 1);
  EXPECT_EQ(m.tpot.mean_ms, 0);
  EXPECT_TRUE(m.itl.percentiles_ms.size() == 1 && m.itl.percentiles_ms[0].second == 0);
  EXPECT_EQ(m.max_output_tokens_per_s, 1);
  EXPECT_EQ(m.max_concurrent_requests, 1);
}

TEST(CalculateMetricsTest, AllFailedGivesZeros) {
  const BenchmarkMetrics m = CalculateMetrics({Failed(5), Failed(6)}, 1.0, {99}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.total_input, 0);
  EXPECT_EQ(m.total_output, 0);
  EXPECT_EQ(m.request_throughput, 0);
  EXPECT_EQ(m.ttft.mean_ms, 0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0);
  EXPECT_EQ(m.max_concurrent_requests, 0);
}

TEST(CalculateMetricsTest, WithoutUsageTheTextIsRetokenized) {
  RequestOutput o = Ok(0, 0.1, {0.1}, 0.2, 0, 3);
  o.generated_text = "a b c";
  const BenchmarkMetrics m = CalculateMetrics(
      {o}, 1.0, {99}, {}, [](const std::string& text) { return int64_t(text.size() / 2 + 1); });
  EXPECT_EQ(m.total_output, 3);
  EXPECT_NEAR(m.tpot.mean_ms, 50, kTol);
}

TEST(ParseGoodputTest, RejectsBadPairs) {
  EXPECT_TRUE(ParseGoodput("").ok());
  EXPECT_TRUE(ParseGoodput("").value().empty());
  Result<GoodputSlo> g = ParseGoodput("ttft:100 tpot:50.5");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*g->ttft_ms, 100);
  EXPECT_EQ(*g->tpot_ms, 50.5);
  EXPECT_FALSE(g->e2el_ms.has_value());
  for (const char* bad : {"ttft", "ttft:", "foo:1", "ttft:-1", "ttft:abc", "ttft:1:2", "ttft:1x"}) {
    Result<GoodputSlo> r = ParseGoodput(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--goodput"), std::string::npos) << bad;
  }
}

RunInfo Info() {
  RunInfo run;
  run.backend = "openai";
  run.model_id = "tiny";
  run.tokenizer_id = "/m";
  run.num_prompts = 4;
  run.request_rate = std::numeric_limits<double>::infinity();
  run.duration_s = 2.0;
  run.percentile_metrics = {"ttft", "tpot", "itl"};
  run.percentiles = {99};
  return run;
}

TEST(FormatSummaryTest, VllmLayout) {
  RunInfo run = Info();
  run.max_concurrency = 4;
  const std::string s = FormatSummary(run, CalculateMetrics(SampleRun(), 2.0, {99}, {}));
  EXPECT_EQ(s.rfind("============ Serving Benchmark Result ============\n", 0), 0u) << s;
  EXPECT_NE(s.find("\nSuccessful requests:                     3         \n"), std::string::npos)
      << s;
  EXPECT_NE(s.find("\nFailed requests:                         1         \n"), std::string::npos);
  EXPECT_NE(s.find("\nMaximum request concurrency:             4         \n"), std::string::npos);
  EXPECT_EQ(s.find("Request rate configured"), std::string::npos);  // infinite rate
  EXPECT_EQ(s.find("goodput"), std::string::npos);
  EXPECT_NE(s.find("\nBenchmark duration (s):                  2.00      \n"), std::string::npos);
  EXPECT_NE(s.find("\nPeak concurrent requests:                2.00      \n"), std::string::npos);
  EXPECT_NE(s.find("\n---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(s.find("\n-----Time per Output Token (excl. 1st token)------\n"), std::string::npos);
  EXPECT_NE(s.find("\nP99 ITL (ms):                            292.00    \n"), std::string::npos);
  EXPECT_EQ(s.find("E2EL"), std::string::npos);
  EXPECT_EQ(s.substr(s.size() - 51), std::string(50, '=') + "\n");
}

TEST(ResultJsonTest, VllmKeys) {
  RunInfo run = Info();
  run.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  run.percentiles = {50, 99.9};
  const std::vector<RequestOutput> outputs = SampleRun();
  const json j = json::parse(
      ResultJson(run, CalculateMetrics(outputs, 2.0, run.percentiles, {}), outputs, "20250101-1"));
  for (const char* key : {"date",
                          "endpoint_type",
                          "backend",
                          "label",
                          "model_id",
                          "tokenizer_id",
                          "num_prompts",
                          "request_rate",
                          "burstiness",
                          "max_concurrency",
                          "duration",
                          "completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "request_goodput",
                          "output_throughput",
                          "total_token_throughput",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "generated_texts",
                          "errors",
                          "max_output_tokens_per_s",
                          "max_concurrent_requests"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* stat : {"mean", "median", "std", "p50", "p99.9"}) {
      EXPECT_TRUE(j.contains(fmt::format("{}_{}_ms", stat, metric))) << stat << metric;
    }
  }
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_EQ(j["input_lens"], json({10, 20, 30, 5}));
  EXPECT_EQ(j["output_lens"], json({4, 1, 0, 3}));
  EXPECT_EQ(j["errors"][2], "HTTP 500");
  EXPECT_EQ(j["itls"][0].size(), 3u);
  EXPECT_NEAR(j["ttfts"][3].get<double>(), 0.3, kTol);  // seconds, as vLLM keeps them
  EXPECT_NEAR(j["p99.9_itl_ms"].get<double>(), 299.2, 1e-6);

  // Only the selected metrics get statistics; a finite rate is a number.
  run.percentile_metrics = {"ttft"};
  run.request_rate = 2;
  const json k = json::parse(
      ResultJson(run, CalculateMetrics(outputs, 2.0, run.percentiles, {}), outputs, "d"));
  EXPECT_TRUE(k.contains("mean_ttft_ms"));
  EXPECT_FALSE(k.contains("mean_tpot_ms"));
  EXPECT_EQ(k["request_rate"], 2.0);
}

}  // namespace
}  // namespace moeserve::bench
