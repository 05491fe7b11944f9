// Speculative decoding end to end, through the real binary: `generate --spec` gives the same
// greedy tokens as without (one prompt and eight at once) and reports acceptance under
// docs/cli.md's keys; seeded sampling with drafts repeats alone and in a batch; `serve --spec`
// answers as `generate` does, streams several tokens per chunk, and counts drafts in /metrics under
// vLLM's names; `bench latency --spec` prints the acceptance; bad --spec values exit 2 naming the
// flag.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"
#include "core/test_paths.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Under AddressSanitizer (a Debug build, many times slower) the matrices below are cut to one
// configuration each: that pass looks for memory errors, the Release pass runs them all.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

class SpecE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / fmt::format("moeserve_spec_{}", getpid()));
    fs::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  static e2e::CommandResult Run(const std::string& args) {
    return e2e::RunMoeserve(args, *dir_ / "err.txt");
  }

  // generate --json over a prompts file (the default model unless `model` is given).
  static json Generate(const std::vector<json>& lines, const std::string& flags,
                       const std::string& model = "") {
    const fs::path file = *dir_ / "prompts.jsonl";
    std::ofstream out(file);
    for (const json& line : lines) out << line.dump() << "\n";
    out.close();
    const e2e::CommandResult r =
        Run(fmt::format("generate {} --prompts-file {} --json {}",
                        model.empty() ? "" : "--model " + model, file.string(), flags));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json();
  }

  static fs::path* dir_;
};

fs::path* SpecE2eTest::dir_ = nullptr;

std::vector<json> EightRequests(bool greedy) {
  const char* prompts[] = {"And it came to pass", "Elizabeth was", "In the beginning",
                           "Mr. Darcy", "And God said", "It is a truth universally",
                           "The LORD is my shepherd", "She was"};
  std::vector<json> lines;
  for (int i = 0; i < 8; ++i) {
    json line = {{"prompt", prompts[i]}, {"max_tokens", 40 + 3 * i}, {"ignore_eos", true}};
    if (!greedy) {
      line["temperature"] = 0.8;
      line["top_p"] = 0.95;
      line["seed"] = 1000 + i;
    }
    lines.push_back(line);
  }
  return lines;
}

TEST_F(SpecE2eTest, GreedyGenerateEqualsPlainAndReportsAcceptance) {
  const std::vector<json> lines = EightRequests(/*greedy=*/true);
  const json plain = Generate(lines, "");
  const std::vector<std::string> specs =
      kSanitized ? std::vector<std::string>{"mtp:3"}
                 : std::vector<std::string>{"mtp:1", "mtp:3", "ngram:2", "ngram:4"};
  for (const std::string& spec : specs) {
    SCOPED_TRACE(spec);
    // Eight at once, and concurrency 1 (one request at a time).
    for (const std::string concurrency : {"", "--max-num-seqs 1"}) {
      const json with =
          Generate(lines, "--spec " + spec + " --spec-disable-batch-size 0 " + concurrency);
      ASSERT_EQ(with["requests"].size(), 8u);
      int64_t drafts = 0, accepted = 0;
      for (size_t i = 0; i < 8; ++i) {
        EXPECT_EQ(with["requests"][i]["token_ids"], plain["requests"][i]["token_ids"])
            << "request " << i << " " << concurrency;
        EXPECT_EQ(with["requests"][i]["text"], plain["requests"][i]["text"]);
        const json& s = with["requests"][i]["spec"];
        drafts += s["num_draft_tokens"].get<int64_t>();
        accepted += s["num_accepted_tokens"].get<int64_t>();
        EXPECT_GE(s["mean_acceptance_length"].get<double>(), 1.0);
        EXPECT_EQ(s["num_accepted_tokens_per_pos"].size(), static_cast<size_t>(spec.back() - '0'));
        EXPECT_TRUE(s.contains("acceptance_rate"));
      }
      EXPECT_GT(drafts, 0);
      if (spec.starts_with("mtp")) {
        EXPECT_GT(accepted, 0) << "the trained MTP head never agreed";
      }
    }
  }
}

// Verification draws each row's token as decoding would (engine/sampler.h, Verify): seeded
// sampling gives the same tokens with or without drafts, alone, in a batch, and when drafting
// pauses because the batch is large.
TEST_F(SpecE2eTest, SeededSamplingWithDraftsEqualsWithout) {
  const std::vector<json> lines = EightRequests(/*greedy=*/false);
  const json plain = Generate(lines, "");
  const json batched = Generate(lines, "--spec mtp:3 --spec-disable-batch-size 0");
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(batched["requests"][i]["token_ids"], plain["requests"][i]["token_ids"]) << i;
    EXPECT_GT(batched["requests"][i]["spec"]["num_drafts"].get<int64_t>(), 0);
  }
  if (kSanitized) return;
  const json alone = Generate(lines, "--spec mtp:3 --max-num-seqs 1");
  const json paused = Generate(lines, "--spec ngram:2 --spec-disable-batch-size 2");
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(alone["requests"][i]["token_ids"], plain["requests"][i]["token_ids"]) << i;
    EXPECT_EQ(paused["requests"][i]["token_ids"], plain["requests"][i]["token_ids"]) << i;
  }
}

TEST_F(SpecE2eTest, StopsInsideAnAcceptedRunAndLogprobsPerToken) {
  // Greedy with a stop string and logprobs: identical to the plain run, one logprobs entry per
  // emitted token even when several arrive in one step.
  const std::vector<json> lines = {
      {{"prompt", "And it came to pass"}, {"max_tokens", 60}, {"logprobs", 2}, {"stop", json::array({"LORD"})}},
      {{"prompt", "Elizabeth was"}, {"max_tokens", 7}, {"logprobs", 1}},
      {{"prompt", "And God said"}, {"max_tokens", 50}, {"min_tokens", 20}}};
  const json plain = Generate(lines, "");
  const json with = Generate(lines, "--spec mtp:4 --spec-disable-batch-size 0");
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(with["requests"][i]["token_ids"], plain["requests"][i]["token_ids"]) << i;
    EXPECT_EQ(with["requests"][i]["text"], plain["requests"][i]["text"]) << i;
    EXPECT_EQ(with["requests"][i]["finish_reason"], plain["requests"][i]["finish_reason"]) << i;
    if (lines[i].contains("logprobs")) {
      EXPECT_EQ(with["requests"][i]["logprobs"], plain["requests"][i]["logprobs"]) << i;
    }
  }
  EXPECT_EQ(with["requests"][1]["token_ids"].size(), 7u);  // max_tokens never exceeded
}

// The engine's MTP acceptance on the default model equals the PyTorch estimate the training tools
// made (tools/train/mtp_acceptance.py, the same 16 held-out prompts, greedy, 128 tokens): per
// draft position, the fraction of verify steps that accepted it, within 0.05, for K = 1, 2, 3.
TEST_F(SpecE2eTest, MtpAcceptanceMatchesThePyTorchEstimate) {
  if (kSanitized) GTEST_SKIP() << "numbers, not memory: the Release pass runs this";
  const json data = json::parse(
      e2e::ReadFile(fs::path(MOESERVE_SOURCE_DIR) / "tests" / "data" / "mtp_heldout_prompts.json"));
  std::vector<json> lines;
  for (const json& prompt : data["prompts"]) {
    lines.push_back({{"token_ids", prompt},
                     {"max_tokens", data["max_tokens"]},
                     {"stop_token_ids", data["stop_token_ids"]},
                     {"repetition_penalty", 1}});
  }
  const std::vector<double> expected = data["pytorch_accepted_per_position"];
  for (int k = kSanitized ? 3 : 1; k <= 3; ++k) {
    // Every step drafts K (no adaptive drafting): the estimate assumes K drafts at every step.
    const json result = Generate(
        lines, fmt::format("--spec mtp:{} --spec-min-acceptance 0 --spec-disable-batch-size 0", k));
    int64_t drafts = 0;
    std::vector<int64_t> accepted(k, 0);
    for (const json& r : result["requests"]) {
      drafts += r["spec"]["num_drafts"].get<int64_t>();
      for (int pos = 0; pos < k; ++pos) {
        accepted[pos] += r["spec"]["num_accepted_tokens_per_pos"][pos].get<int64_t>();
      }
    }
    ASSERT_GT(drafts, 500);
    for (int pos = 0; pos < k; ++pos) {
      const double rate = static_cast<double>(accepted[pos]) / drafts;
      std::printf("mtp:%d position %d: accepted %.3f of %lld steps (PyTorch %.3f)\n", k, pos + 1,
                  rate, static_cast<long long>(drafts), expected[pos]);
      EXPECT_NEAR(rate, expected[pos], 0.05) << "K = " << k << ", position " << pos + 1;
    }
  }
}

TEST_F(SpecE2eTest, BadSpecFlagsExit2) {
  for (const std::string bad : {"--spec mtp", "--spec mtp:9", "--spec eagle:2",
                                "--spec-disable-batch-size -1", "--spec-min-acceptance 2",
                                "--spec-min-acceptance nan"}) {
    const e2e::CommandResult r = Run("generate --prompt hi --max-tokens 2 " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("--spec"), std::string::npos) << r.err;
  }
  // A model without an MTP layer.
  const fs::path moe = *dir_ / "moe";
  ASSERT_EQ(Run(fmt::format("make-model --arch qwen3_moe --preset tiny --out {}", moe.string()))
                .exit_code,
            0);
  const e2e::CommandResult r =
      Run(fmt::format("generate --model {} --token-ids 1,2 --spec mtp:2", moe.string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no MTP layer"), std::string::npos) << r.err;
}

TEST_F(SpecE2eTest, BenchLatencyReportsAcceptance) {
  const fs::path out = *dir_ / "bench.json";
  const e2e::CommandResult r =
      Run(fmt::format("bench latency --batch-size 1,2 --input-len 16 --output-len 24 --spec mtp:2 "
                      "--json {}",
                      out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("speculative      mtp:2"), std::string::npos) << r.out;
  std::ifstream in(out);
  const json j = json::parse(in);
  for (const json& run : j["runs"]) {
    EXPECT_EQ(run["spec"]["method"], "mtp:2");
    EXPECT_GT(run["spec"]["num_drafts"].get<int64_t>(), 0);
    EXPECT_EQ(run["spec"]["num_accepted_tokens_per_pos"].size(), 2u);
    EXPECT_GT(run["tpot_ms"].get<double>(), 0);
  }
}

TEST_F(SpecE2eTest, ServeWithDrafts) {
  e2e::ServerProcess server({"--spec", "mtp:3", "--max-model-len", "512"}, *dir_ / "serve.err");
  ASSERT_TRUE(server.ok()) << server.log();
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(120, 0);
  const json body = {{"prompt", "And it came to pass"},
                     {"max_tokens", 48},        {"temperature", 0},
                     {"repetition_penalty", 1}, {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json answer = json::parse(r->body);
  const json plain = Generate({{{"prompt", "And it came to pass"},
                                {"max_tokens", 48},
                                {"repetition_penalty", 1},
                                {"ignore_eos", true}}},
                              "");
  EXPECT_EQ(answer["choices"][0]["text"], plain["requests"][0]["text"]);

  // The stream carries the same text; some chunks hold several tokens (accepted drafts).
  json streamed = body;
  streamed["stream"] = true;
  streamed["logprobs"] = 0;
  std::string text;
  size_t max_tokens_in_chunk = 0;
  auto s = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(s);
  size_t pos = 0;
  while ((pos = s->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = s->body.find("\n\n", pos);
    const std::string data = s->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    const json chunk = json::parse(data);
    if (chunk["choices"].empty()) continue;
    text += chunk["choices"][0]["text"].get<std::string>();
    const json& lp = chunk["choices"][0]["logprobs"];
    if (lp.is_object()) max_tokens_in_chunk = std::max(max_tokens_in_chunk, lp["tokens"].size());
  }
  EXPECT_EQ(text, plain["requests"][0]["text"]);
  EXPECT_GT(max_tokens_in_chunk, 1u) << "no chunk carried more than one token";

  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name :
       {"vllm:spec_decode_num_drafts_total{", "vllm:spec_decode_num_draft_tokens_total{",
        "vllm:spec_decode_num_accepted_tokens_total{",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{"}) {
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
  }
  EXPECT_NE(m->body.find("position=\"2\"}"), std::string::npos);
  EXPECT_EQ(m->body.find("position=\"3\"}"), std::string::npos);
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace moeserve
