// `moeserve bench serve` against the real `moeserve serve` on a tiny random model: the result
// JSON is consistent with itself and with vLLM's definitions (completed and token totals,
// throughputs = totals / duration, TPOT from the per-request chunk times, statistics inside the
// per-request values), for a closed loop, Poisson arrivals, the chat endpoint and goodput SLOs;
// an unreachable server exits 1 naming the URL, a bad flag exits 2 naming the flag.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kApiKey[] = "bench-key";
constexpr int kPrompts = 12;
constexpr int kInputLen = 32;
constexpr int kOutputLen = 8;

class BenchServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("moeserve_bench_serve_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    const e2e::CommandResult made = e2e::RunMoeserve(
        fmt::format("make-model --arch qwen3_next --preset tiny --seed 3 --out {}", Model()),
        *dir_ / "make_model.err");
    ASSERT_EQ(made.exit_code, 0) << made.err;
    // No --served-model-name: /v1/models lists the folder, which bench serve then takes as its
    // model and tokenizer.
    server_ = new e2e::ServerProcess(
        {"--model", Model(), "--max-model-len", "256", "--api-key", kApiKey}, *dir_ / "serve.err");
    ASSERT_TRUE(server_->ok()) << "the server did not become healthy: " << server_->log();
  }

  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(), 0) << server_->log();
      delete server_;
    }
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::string Model() { return (*dir_ / "model").string(); }

  // Runs `bench serve` against the server with the small default load plus `extra`; returns the
  // result JSON (and the command's output in *run).
  static json Bench(const std::string& extra, e2e::CommandResult* run = nullptr) {
    const fs::path result = *dir_ / "result.json";
    fs::remove(result);
    const e2e::CommandResult r = e2e::RunMoeserve(
        fmt::format("bench serve --base-url {} --api-key {} --num-prompts {} "
                    "--random-input-len {} --random-output-len {} --ignore-eos --result-json {} {}",
                    server_->url(), kApiKey, kPrompts, kInputLen, kOutputLen, result.string(),
                    extra),
        *dir_ / "bench.err");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    if (run != nullptr) *run = r;
    const json j = json::parse(e2e::ReadFile(result), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
    return j;
  }

  static fs::path* dir_;
  static e2e::ServerProcess* server_;
};

fs::path* BenchServeTest::dir_ = nullptr;
e2e::ServerProcess* BenchServeTest::server_ = nullptr;

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// mean within [min, max] of the values (ms vs s), p99 >= median >= 0, std >= 0.
void ExpectStatsInside(const json& j, const std::string& metric, const std::vector<double>& s) {
  SCOPED_TRACE(metric);
  ASSERT_FALSE(s.empty());
  const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
  const double mean = j["mean_" + metric + "_ms"];
  EXPECT_GE(mean, *lo * 1000 - 1e-6);
  EXPECT_LE(mean, *hi * 1000 + 1e-6);
  EXPECT_NEAR(mean, Mean(s) * 1000, 1e-6);
  EXPECT_GE(j["p99_" + metric + "_ms"].get<double>(), j["median_" + metric + "_ms"].get<double>());
  EXPECT_GE(j["median_" + metric + "_ms"].get<double>(), 0);
  EXPECT_GE(j["std_" + metric + "_ms"].get<double>(), 0);
}

// What every run of kPrompts requests must satisfy. For the completions endpoint the end of a
// request is its last content chunk, so E2EL = TTFT + sum(ITL) and TPOT = sum(ITL) / (out - 1).
void ExpectConsistent(const json& j, bool chat) {
  EXPECT_EQ(j["num_prompts"], kPrompts);
  EXPECT_EQ(j["completed"], kPrompts);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_input_tokens"], kPrompts * kInputLen);  // the tiny tokenizer converges
  EXPECT_EQ(j["total_output_tokens"], kPrompts * kOutputLen);
  EXPECT_EQ(j["output_lens"], json(std::vector<int>(kPrompts, kOutputLen)));
  EXPECT_EQ(j["input_lens"], json(std::vector<int>(kPrompts, kInputLen)));
  for (const json& e : j["errors"]) EXPECT_EQ(e, "");

  const double duration = j["duration"];
  ASSERT_GT(duration, 0);
  EXPECT_NEAR(j["request_throughput"].get<double>(), kPrompts / duration, 1e-9);
  EXPECT_NEAR(j["output_throughput"].get<double>(), kPrompts * kOutputLen / duration, 1e-9);
  EXPECT_NEAR(j["total_token_throughput"].get<double>(),
              kPrompts * (kInputLen + kOutputLen) / duration, 1e-9);

  std::vector<double> ttfts, itls, e2els, tpots;
  int64_t chunks = 0;
  for (int i = 0; i < kPrompts; ++i) {
    const double ttft = j["ttfts"][i];
    EXPECT_GT(ttft, 0);
    ttfts.push_back(ttft);
    const std::vector<double> gaps = j["itls"][i];
    // A chunk per token at most, plus a finishing one (chat: plus the role chunk).
    EXPECT_LE(gaps.size(), static_cast<size_t>(kOutputLen + (chat ? 1 : 0)));
    chunks += static_cast<int64_t>(gaps.size()) + 1;
    itls.insert(itls.end(), gaps.begin(), gaps.end());
    const double decode = std::accumulate(gaps.begin(), gaps.end(), 0.0);
    if (!chat) {
      // 0 when the server sent all tokens in one chunk (a busy handler coalesces them).
      EXPECT_GE(decode, 0);
      tpots.push_back(decode / (kOutputLen - 1));
      e2els.push_back(ttft + decode);
    }
  }
  ExpectStatsInside(j, "ttft", ttfts);
  ExpectStatsInside(j, "itl", itls);
  EXPECT_GT(j["mean_tpot_ms"].get<double>(), 0);
  EXPECT_GE(j["p99_tpot_ms"].get<double>(), j["median_tpot_ms"].get<double>());
  if (!chat) {
    for (double tpot : tpots) EXPECT_GE(tpot, 0);
    ExpectStatsInside(j, "tpot", tpots);
    if (j.contains("mean_e2el_ms")) ExpectStatsInside(j, "e2el", e2els);
  }
  EXPECT_GE(j["max_concurrent_requests"].get<int64_t>(), 1);
  EXPECT_LE(j["max_concurrent_requests"].get<int64_t>(), kPrompts);
  EXPECT_GE(j["max_output_tokens_per_s"].get<double>(), 1);
  EXPECT_LE(j["max_output_tokens_per_s"].get<double>(), static_cast<double>(chunks));
}

TEST_F(BenchServeTest, ClosedLoopWithMaxConcurrency) {
  e2e::CommandResult run;
  const json j = Bench(
      "--max-concurrency 4 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99",
      &run);
  ExpectConsistent(j, /*chat=*/false);
  // Without --model: the first model of /v1/models, also the tokenizer (a folder).
  EXPECT_EQ(j["model_id"], Model());
  EXPECT_EQ(j["tokenizer_id"], Model());
  EXPECT_EQ(j["backend"], "openai");
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_TRUE(j.contains("p50_e2el_ms"));
  // vLLM's summary on stdout.
  EXPECT_NE(run.out.find("============ Serving Benchmark Result ============\n"
                         "Successful requests:                     12        \n"
                         "Failed requests:                         0         \n"
                         "Maximum request concurrency:             4         \n"),
            std::string::npos)
      << run.out;
  for (const char* row : {"Benchmark duration (s):", "Total generated tokens:                  96",
                          "Mean TTFT (ms):", "P99 TPOT (ms):", "Median ITL (ms):", "P50 E2EL (ms):",
                          "-----Time per Output Token (excl. 1st token)------"}) {
    EXPECT_NE(run.out.find(row), std::string::npos) << row << "\n" << run.out;
  }
}

TEST_F(BenchServeTest, PoissonArrivals) {
  // 12 requests at 40/s: the last is sent at 12 / 40 = 0.3 s (vLLM rescales the gaps).
  const json j = Bench("--request-rate 40 --seed 3");
  ExpectConsistent(j, /*chat=*/false);
  EXPECT_EQ(j["request_rate"], 40.0);
  EXPECT_EQ(j["burstiness"], 1.0);
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_GT(j["duration"].get<double>(), 0.3);
}

TEST_F(BenchServeTest, ChatEndpoint) {
  e2e::CommandResult run;
  const json j = Bench(
      fmt::format("--endpoint /v1/chat/completions --model {} --tokenizer {}", Model(), Model()),
      &run);
  ExpectConsistent(j, /*chat=*/true);
  EXPECT_EQ(j["backend"], "openai-chat");
  EXPECT_EQ(j["generated_texts"].size(), static_cast<size_t>(kPrompts));
}

TEST_F(BenchServeTest, Goodput) {
  e2e::CommandResult run;
  const json all = Bench("--max-concurrency 6 --goodput ttft:1e9 tpot:1e9 e2el:1e9", &run);
  EXPECT_NE(run.out.find("Request goodput (req/s):"), std::string::npos) << run.out;
  EXPECT_EQ(all["request_goodput"].get<double>(), all["request_throughput"].get<double>());
  const json none = Bench("--max-concurrency 6 --goodput ttft:0.0001");
  EXPECT_EQ(none["request_goodput"].get<double>(), 0);
  EXPECT_EQ(none["completed"], kPrompts);
}

TEST_F(BenchServeTest, ApiKeyFromTheEnvironment) {
  // No --api-key: $OPENAI_API_KEY, as vLLM; a wrong key fails the test request with the status.
  setenv("OPENAI_API_KEY", kApiKey, 1);
  const fs::path result = *dir_ / "env.json";
  e2e::CommandResult r =
      e2e::RunMoeserve(fmt::format("bench serve --base-url {} --num-prompts 2 --random-input-len 8 "
                                   "--random-output-len 2 --result-json {}",
                                   server_->url(), result.string()),
                       *dir_ / "env.err");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(e2e::ReadFile(result))["completed"], 2);
  setenv("OPENAI_API_KEY", "wrong", 1);
  r = e2e::RunMoeserve(
      fmt::format("bench serve --base-url {} --model {} --tokenizer {} --num-prompts 2 "
                  "--random-input-len 8",
                  server_->url(), Model(), Model()),
      *dir_ / "env.err");
  unsetenv("OPENAI_API_KEY");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HTTP 401"), std::string::npos) << r.err;
}

TEST_F(BenchServeTest, UnreachableServerExits1NamingTheUrl) {
  const std::string url = fmt::format("http://127.0.0.1:{}", e2e::FreePort());
  // Without --model the model list is asked for first; with it, the test request fails.
  e2e::CommandResult r = e2e::RunMoeserve(
      fmt::format("bench serve --base-url {} --num-prompts 2", url), *dir_ / "down.err");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(url + "/v1/models"), std::string::npos) << r.err;
  r = e2e::RunMoeserve(fmt::format("bench serve --base-url {} --model m --tokenizer {} "
                                   "--num-prompts 2 --ready-check-timeout-sec 1",
                                   url, Model()),
                       *dir_ / "down.err");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(url + "/v1/completions"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("could not connect"), std::string::npos) << r.err;
}

TEST_F(BenchServeTest, BadFlagsExit2NamingTheFlag) {
  const std::pair<const char*, const char*> cases[] = {
      {"--no-such-flag", "--no-such-flag"},
      {"--num-prompts x", "--num-prompts"},
      {"--endpoint /v1/embeddings", "--endpoint"},
      {"--request-rate 0", "--request-rate"},
      {"--goodput ttft", "--goodput"},
      {"--percentile-metrics ttft,foo", "--percentile-metrics"},
      {"--random-range-ratio 1.5", "--random-range-ratio"},
      {"--max-concurrency -1", "--max-concurrency"},
      {"--base-url 127.0.0.1:8000", "--base-url"},
  };
  for (const auto& [args, flag] : cases) {
    const e2e::CommandResult r =
        e2e::RunMoeserve(std::string("bench serve ") + args, *dir_ / "flags.err");
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace moeserve
