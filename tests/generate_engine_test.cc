// Runs `moeserve generate` and `moeserve bench latency` through the engine as a user would, on
// tiny random models: many concurrent requests give, token for token, what each gives alone
// (also under chunked prefill and preemption, and when sampling with a seed); n, stop strings,
// logprobs and the token constraints act as vLLM's; bad --prompts-file lines and flags exit 2
// naming the line and the parameter.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "tests/run_binary.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using e2e::CommandResult;
using e2e::ReadFile;

using e2e::WriteFile;

std::string JoinIds(const json& ids) {
  std::string out;
  for (const json& id : ids) {
    if (!out.empty()) out += ',';
    out += id.dump();
  }
  return out;
}

// n random ids in [0, vocab), drawn from rng.
std::vector<int32_t> RandomIds(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

class GenerateEngineTest : public ::testing::Test {
 protected:
  // Two tiny models: hybrid (GDN + attention + MTP, 512-token vocabulary) and attention-only.
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("moeserve_generate_engine_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    for (const char* arch : {"qwen3_next", "qwen3"}) {
      const CommandResult made =
          Run(fmt::format("make-model --arch {} --preset tiny --seed 3 "
                          "--out {}",
                          arch, (*dir_ / arch).string()));
      ASSERT_EQ(made.exit_code, 0) << made.err;
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  // Runs `moeserve <args>`; args are passed through the shell as written.
  static CommandResult Run(const std::string& args) {
    return e2e::RunMoeserve(args, *dir_ / "stderr.txt");
  }

  static std::string Model(const char* arch) { return (*dir_ / arch).string(); }
  static fs::path Path(const std::string& name) { return *dir_ / name; }

  // `generate --json` over the given lines; the parsed "requests".
  static json GenerateLines(const std::string& model, const std::vector<json>& lines,
                            const std::string& flags, std::string* err = nullptr) {
    std::string text;
    for (const json& line : lines) text += line.dump() + "\n";
    const fs::path file = Path("lines.jsonl");
    WriteFile(file, text);
    const CommandResult r = Run(fmt::format("generate --model {} --prompts-file {} --json {}",
                                            model, file.string(), flags));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (err != nullptr) *err = r.err;
    return r.exit_code == 0 ? json::parse(r.out)["requests"] : json::array();
  }

  // The choices of the request of `line` run alone, through flags: --token-ids and, for each
  // other key, --key-with-dashes (a line's key and its flag mean the same). Only for lines whose
  // keys all have a flag (not logit_bias, bad_words, ..., nor a list of stop strings).
  static json GenerateWithFlags(const std::string& model, const json& line) {
    std::string flags;
    for (const auto& [key, value] : line.items()) {
      std::string flag = "--" + key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      if (value.is_boolean()) {
        if (value.get<bool>()) flags += " " + flag;
      } else if (value.is_array()) {
        flags += fmt::format(" {} {}", flag, JoinIds(value));
      } else if (value.is_string()) {
        flags += fmt::format(" {} '{}'", flag, value.get<std::string>());
      } else {
        flags += fmt::format(" {} {}", flag, value.dump());
      }
    }
    const CommandResult r = Run(fmt::format("generate --model {} --json{}", model, flags));
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["requests"] : json::array();
  }

  // The request of `line` run alone: through flags for token ids, as a one-line --prompts-file
  // for a text prompt.
  static json GenerateAlone(const std::string& model, const json& line) {
    const json requests =
        line.contains("prompt") ? GenerateLines(model, {line}, "") : GenerateWithFlags(model, line);
    return requests.empty() ? json() : requests[0];
  }

  // Checks every request of a concurrent run against the same line run alone.
  static void ExpectSameAsAlone(const std::string& model, const std::vector<json>& lines,
                                const json& together) {
    ASSERT_EQ(together.size(), lines.size());
    for (size_t i = 0; i < lines.size(); ++i) {
      SCOPED_TRACE(lines[i].dump());
      const json alone = GenerateAlone(model, lines[i]);
      EXPECT_EQ(together[i]["token_ids"], alone["token_ids"]);
      EXPECT_EQ(together[i]["finish_reason"], alone["finish_reason"]);
      EXPECT_EQ(together[i]["num_prompt_tokens"], alone["num_prompt_tokens"]);
    }
  }

  static fs::path* dir_;
};

fs::path* GenerateEngineTest::dir_ = nullptr;

// (a) Eight requests of different lengths and stop conditions, run concurrently, give what each
// gives alone; max_tokens, ignore_eos, stop_token_ids and min_tokens act as vLLM's.
TEST_F(GenerateEngineTest, ConcurrentRequestsMatchEachAlone) {
  const std::string model = Model("qwen3_next");
  std::mt19937 rng(11);
  // A reference continuation, to build stop-token cases whose outcome is known.
  const std::vector<int32_t> base = RandomIds(rng, 12, 512);
  const json reference =
      GenerateAlone(model, {{"token_ids", base}, {"max_tokens", 12}, {"ignore_eos", true}});
  ASSERT_EQ(reference["token_ids"].size(), 12u);
  const int32_t stop_id = reference["token_ids"][3];

  std::vector<json> lines;
  const int lengths[] = {3, 10, 17, 30, 45, 64, 70};
  for (int i = 0; i < 7; ++i) {
    json line = {{"token_ids", RandomIds(rng, lengths[i], 512)}, {"max_tokens", 2 + i}};
    if (i % 2 == 0) line["ignore_eos"] = true;
    if (i == 3) line["min_tokens"] = 4;
    lines.push_back(line);
  }
  lines.push_back({{"token_ids", base}, {"max_tokens", 12}, {"stop_token_ids", {stop_id}}});

  // Engine flags different from the alone runs': a smaller cache and token budget.
  const json together = GenerateLines(model, lines, "--max-num-seqs 8 --max-model-len 256");
  ExpectSameAsAlone(model, lines, together);

  ASSERT_EQ(together.size(), 8u);
  for (size_t i = 0; i < together.size(); ++i) {
    SCOPED_TRACE(i);
    const json& r = together[i];
    EXPECT_EQ(r["index"], i);
    EXPECT_EQ(r["num_prompt_tokens"], lines[i]["token_ids"].size());
    EXPECT_LE(r["token_ids"].size(), lines[i]["max_tokens"].get<size_t>());
    EXPECT_GE(r["ttft_ms"].get<double>(), 0.0);
    EXPECT_GE(r["tpot_ms"].get<double>(), 0.0);
    if (lines[i].value("ignore_eos", false)) {
      EXPECT_EQ(r["finish_reason"], "length");
      EXPECT_EQ(r["token_ids"].size(), lines[i]["max_tokens"].get<size_t>());
    }
    if (lines[i].contains("min_tokens")) {
      EXPECT_GE(r["token_ids"].size(), lines[i]["min_tokens"].get<size_t>());
    }
  }
  // The stop id ends the request at its first occurrence, the stop id included.
  json expected = json::array();
  for (const json& id : reference["token_ids"]) {
    expected.push_back(id);
    if (id == stop_id) break;
  }
  EXPECT_EQ(together[7]["token_ids"], expected);
  EXPECT_EQ(together[7]["finish_reason"], "stop");
}

// (b) A prompt longer than --max-model-len is a usage error naming the request and its line.
TEST_F(GenerateEngineTest, TooLongPromptNamesTheLine) {
  std::mt19937 rng(5);
  const fs::path file = Path("too_long.jsonl");
  WriteFile(file, json({{"token_ids", RandomIds(rng, 10, 512)}}).dump() + "\n" +
                      json({{"token_ids", RandomIds(rng, 80, 512)}}).dump() + "\n");
  const CommandResult r =
      Run(fmt::format("generate --model {} --max-model-len 64 --prompts-file {}",
                      Model("qwen3_next"), file.string()));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("request 1 (" + file.string() + ":2)"), std::string::npos) << r.err;
}

// (c) Bad lines: exit 2 and one line naming the file line and the problem -- the key of a wrong
// type, the parameter of a value vLLM rejects -- before the model loads.
TEST_F(GenerateEngineTest, MalformedLinesExit2NamingTheProblem) {
  const std::string good = R"({"token_ids": [1, 2, 3], "max_tokens": 2})";
  struct Case {
    std::string line;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {R"({"token_ids": [1, 2)", "not valid JSON"},
      {R"([1, 2])", "expected a JSON object"},
      {R"({"token_ids": [1], "colour": 1})", "unknown key \"colour\""},
      {R"({"token_ids": [1], "colour": null})", "unknown key \"colour\""},
      {R"({"prompt": "hi", "token_ids": [1]})", "exactly one of \"prompt\" and \"token_ids\""},
      {R"({"max_tokens": 3})", "exactly one of \"prompt\" and \"token_ids\""},
      {R"({"token_ids": [1, 512]})", "\"token_ids\": 512 is outside the vocabulary [0, 512)"},
      {R"({"token_ids": [1, "a"]})", "\"token_ids\": \"a\" is not an integer"},
      {R"({"token_ids": []})", "\"token_ids\" is empty"},
      // Types, named by the key.
      {R"({"token_ids": [1], "max_tokens": "5"})", "\"max_tokens\" must be an integer"},
      {R"({"token_ids": [1], "top_k": 2.0})", "\"top_k\" must be an integer"},
      {R"({"token_ids": [1], "temperature": "hot"})", "\"temperature\" must be a number"},
      {R"({"token_ids": [1], "ignore_eos": 1})", "\"ignore_eos\" must be true or false"},
      {R"({"token_ids": [1], "stop": 5})", "\"stop\" must be a string or a list of strings"},
      {R"({"token_ids": [1], "stop": ["a", 5]})", "\"stop\": 5 is not a string"},
      {R"({"token_ids": [1], "logit_bias": {"x": 1}})", "\"logit_bias\": key \"x\" is not a"},
      {R"({"token_ids": [1], "logit_bias": {"3": "a"}})", "\"logit_bias\": the bias of token 3"},
      {R"({"token_ids": [1], "bad_words": "no"})", "\"bad_words\" must be a list of strings"},
      {R"({"token_ids": [1], "stop_token_ids": [1.5]})", "\"stop_token_ids\": 1.5 is not an"},
      {R"({"token_ids": [1], "stop_token_ids": [5000000000]})", "5000000000 is not a token id"},
      // Values vLLM rejects, named by the parameter (SamplingParams::Validate).
      {R"({"token_ids": [1], "temperature": 3})", "temperature must be in [0, 2], got 3"},
      {R"({"token_ids": [1], "top_p": 0})", "top_p must be in (0, 1], got 0"},
      {R"({"token_ids": [1], "n": 2})", "n must be 1 when using greedy sampling"},
      {R"({"token_ids": [1], "n": 2, "temperature": 0})", "n must be 1 when using greedy"},
      {R"({"token_ids": [1], "logprobs": -2})", "logprobs must be non-negative or -1, got -2"},
      {R"({"token_ids": [1], "prompt_logprobs": -2})", "prompt_logprobs must be non-negative"},
      {R"({"token_ids": [1], "stop": ""})", "stop cannot contain an empty string"},
      {R"({"token_ids": [1], "stop": ["a", ""]})", "stop cannot contain an empty string"},
      {R"({"token_ids": [1], "max_tokens": 0})", "max_tokens must be at least 1, got 0"},
      {R"({"token_ids": [1], "max_tokens": 2, "min_tokens": 3})",
       "min_tokens must be less than or equal to max_tokens=2, got 3"},
      {R"({"token_ids": [1], "stop_token_ids": [600]})",
       "stop_token_ids contains out-of-vocab token id 600"},
      {R"({"token_ids": [1], "logit_bias": {"600": 1}})", "logit_bias contains out-of-vocab"},
      {R"({"token_ids": [1], "allowed_token_ids": []})", "allowed_token_ids must not be empty"},
  };
  const fs::path file = Path("bad.jsonl");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    // A blank line first: lines are counted in the file, blank ones included.
    WriteFile(file, good + "\n\n" + c.line + "\n");
    const CommandResult r = Run(
        fmt::format("generate --model {} --prompts-file {}", Model("qwen3_next"), file.string()));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(file.string() + ":3: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }

  // Flags: the same rules, naming the flag.
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--token-ids 1 --temperature 3", "--temperature must be in [0, 2], got 3"},
           {"--token-ids 1 --top-p 0", "--top-p must be in (0, 1], got 0"},
           {"--token-ids 1 --n 2", "--n must be 1 when using greedy sampling"},
           {"--token-ids 1 --logprobs -2", "--logprobs must be non-negative or -1, got -2"},
           {"--token-ids 1 --stop ''", "--stop cannot contain an empty string"},
           {"--token-ids 1 --stop-token-ids 1,x", "--stop-token-ids: expected comma-separated"},
           {"--token-ids 1 --stop-token-ids 1,600", "--stop-token-ids contains out-of-vocab"},
           {"--token-ids 1 --min-tokens 20 --max-tokens 4", "--min-tokens must be less than"},
           {"--token-ids 1 --prompts-file " + file.string(), "exactly one of"},
           {"--token-ids 1 --max-num-seqs 0", "--max-num-seqs"},
           {"--token-ids 1 --kv-cache-memory -1", "--kv-cache-memory"},
           {"--token-ids 1 --block-size 0", "--block-size"},
           {"--token-ids 1 --max-model-len 100000", "--max-model-len"},
           {"--prompts-file " + file.string() + " --dump-activations /tmp/x", "single prompt"},
       }) {
    const CommandResult r = Run(fmt::format("generate --model {} {}", Model("qwen3_next"), flags));
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << flags << ": " << r.err;
  }

  // Every key of a line, at values that keep decoding greedy; null is "not given".
  WriteFile(file, R"({"token_ids": [1, 2], "n": 1, "temperature": 0, "top_p": 0.5, )"
                  R"("top_k": -1, "min_p": 0.5, "seed": 7, "presence_penalty": 0, )"
                  R"("frequency_penalty": 0, "repetition_penalty": 1, "max_tokens": null, )"
                  R"("min_tokens": 1, "stop": [], "include_stop_str_in_output": false, )"
                  R"("stop_token_ids": [], "ignore_eos": true, "logprobs": null, )"
                  R"("prompt_logprobs": null, "logit_bias": {}, "allowed_token_ids": null, )"
                  R"("bad_words": [], "skip_special_tokens": true})"
                  "\n");
  const CommandResult r =
      Run(fmt::format("generate --model {} --json --max-tokens 5 --prompts-file {}",
                      Model("qwen3_next"), file.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json request = json::parse(r.out)["requests"][0];
  // "max_tokens": null is "not given": the flags' defaults apply.
  EXPECT_EQ(request["token_ids"].size(), 5u);
  EXPECT_EQ(
      request["token_ids"],
      GenerateAlone(Model("qwen3_next"),
                    {{"token_ids", {1, 2}}, {"max_tokens", 5}, {"ignore_eos", true}})["token_ids"]);
  EXPECT_FALSE(request.contains("logprobs"));
}

// (d) {"prompt": TEXT} lines go through the model's tokenizer; plain output prints each request
// as "[index] text" and a summary on stderr.
TEST_F(GenerateEngineTest, PromptLinesUseTheTokenizer) {
  const std::string model = Model("qwen3_next");
  const std::vector<json> lines = {
      {{"prompt", "Hello world"}, {"max_tokens", 6}, {"ignore_eos", true}},
      {{"prompt", "The quick brown fox jumps over the lazy dog."},
       {"max_tokens", 4},
       {"ignore_eos", true}},
  };
  const json together = GenerateLines(model, lines, "");
  ASSERT_EQ(together.size(), 2u);
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(i);
    CommandResult r = Run(fmt::format("tokenize --model {} --json --text '{}'", model,
                                      lines[i]["prompt"].get<std::string>()));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json ids = json::parse(r.out)["ids"];
    EXPECT_EQ(together[i]["num_prompt_tokens"], ids.size());
    // The same prompt as ids gives the same tokens.
    r = Run(fmt::format("generate --model {} --json --ignore-eos --max-tokens {} --token-ids {}",
                        model, lines[i]["max_tokens"].dump(), JoinIds(ids)));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json alone = json::parse(r.out)["requests"][0];
    EXPECT_EQ(together[i]["token_ids"], alone["token_ids"]);
    EXPECT_EQ(together[i]["text"], alone["text"]);
    // The text is the detokenized output without special tokens.
    r = Run(fmt::format("detokenize --model {} --no-special --ids {}", model,
                        JoinIds(together[i]["token_ids"])));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(together[i]["text"].get<std::string>() + "\n", r.out);
  }

  const fs::path file = Path("prompts.jsonl");
  WriteFile(file, lines[0].dump() + "\n" + lines[1].dump() + "\n");
  const CommandResult r =
      Run(fmt::format("generate --model {} --prompts-file {}", model, file.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string printed = fmt::format("[{}] {}\n", i, together[i]["text"].get<std::string>());
    EXPECT_NE(r.out.find(printed), std::string::npos) << r.out;
  }
  EXPECT_NE(r.err.find("generate: 2 requests, 10 generated tokens"), std::string::npos) << r.err;
}

// (e) bench latency runs each batch size through the engine.
TEST_F(GenerateEngineTest, BenchLatencyBatchSizes) {
  const fs::path out = Path("bench.json");
  const CommandResult r =
      Run(fmt::format("bench latency --model {} --batch-size 1,2 --input-len 8 "
                      "--output-len 4 --json {}",
                      Model("qwen3_next"), out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("aggregate decode at batch 2 = "), std::string::npos) << r.out;
  const json bench = json::parse(ReadFile(out));
  EXPECT_GT(bench["bandwidth_gbs"].get<double>(), 0.0);
  EXPECT_GT(bench["bytes_per_token"].get<int64_t>(), 0);
  ASSERT_EQ(bench["runs"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& run = bench["runs"][i];
    EXPECT_EQ(run["batch_size"], i + 1);
    EXPECT_EQ(run["input_len"], 8);
    EXPECT_EQ(run["output_len"], 4);
    for (const char* key :
         {"prefill_tok_s", "tpot_ms", "decode_tok_s", "roofline_tok_s", "roofline_ratio"}) {
      EXPECT_GT(run[key].get<double>(), 0.0) << key;
    }
  }
  EXPECT_TRUE(bench["ablation"].is_array());

  const CommandResult bad =
      Run(fmt::format("bench latency --model {} --batch-size 4 "
                      "--max-num-seqs 2",
                      Model("qwen3_next")));
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--max-num-seqs 2 is below --batch-size 4"), std::string::npos) << bad.err;
}

// (e2) --ablation measures TPOT with each optimization of the configuration off in turn; --isa
// restricts the SIMD target (printed and in the JSON); --trace writes a Chrome trace of every
// step with each op, per thread and rank.
TEST_F(GenerateEngineTest, BenchLatencyAblationIsaAndTrace) {
  const fs::path out = Path("ablation.json");
  const fs::path trace = Path("trace.json");
  const CommandResult r = Run(fmt::format(
      "bench latency --model {} --batch-size 1 --input-len 8 --output-len 6 --spec mtp:1 "
      "--tp 2 --ablation --ablation-rounds 2 --isa avx2 --trace {} --json {}",
      Model("qwen3_next"), trace.string(), out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("SIMD avx2"), std::string::npos) << r.out;
  const json bench = json::parse(ReadFile(out));
  EXPECT_EQ(bench["isa"], "avx2");
  std::vector<std::string> names;
  for (const json& row : bench["ablation"]) {
    names.push_back(row["optimization"]);
    EXPECT_GT(row["tpot_ms"].get<double>(), 0.0) << row.dump();
    EXPECT_TRUE(row["change_pct"].is_number()) << row.dump();
    EXPECT_NE(r.out.find(row["optimization"].get<std::string>()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(row["flag"].get<std::string>()), std::string::npos) << r.out;
  }
  // The tiny hybrid model has a shared expert; --tp 2 without --ep: no MC2.
  const std::vector<std::string> wanted = {
      "#1 shared expert overlapped with the routed ones", "#5 fused GDN decode step per key head",
      "#8/#9 greedy argmax in the forward (no full logits)",
      "#12 next weights prefetched while ranks wait",
      "#15 fused all-reduce + residual add + RMSNorm", "#17 speculative decoding (mtp:1)"};
  EXPECT_EQ(names, wanted);
  ASSERT_EQ(bench["ablation_baseline_tpot_ms"].size(), 2u);  // one per round
  EXPECT_NE(r.out.find("median of 2 interleaved rounds"), std::string::npos) << r.out;

  // The trace: lanes of both ranks and the engine, steps, and each layer's ops on both ranks.
  const json events = json::parse(ReadFile(trace))["traceEvents"];
  std::map<std::string, int> lanes;  // lane name -> pid
  std::map<std::pair<int, std::string>, int> count;  // (pid, event name) -> events
  for (const json& e : events) {
    if (e["ph"] == "M") lanes[e["args"]["name"]] = e["pid"];
    if (e["ph"] == "X") {
      ++count[{e["pid"].get<int>(), e["name"].get<std::string>()}];
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(lanes["rank 0 engine"], 0);
  EXPECT_EQ(lanes["rank 1"], 1);
  for (const char* name : {"step", "schedule", "forward", "sample", "propose", "update"}) {
    EXPECT_GT((count[{0, name}]), 0) << name;
  }
  for (int pid : {0, 1}) {
    for (const char* name : {"embed", "gated_deltanet", "attention", "moe", "reduce_add_norm",
                             "router", "lm_head", "mtp", "gdn_delta_rule"}) {
      EXPECT_GT((count[{pid, name}]), 0) << "rank " << pid << " " << name;
    }
  }
}

// (f) A token budget of 64 on a hybrid model chunks the 100+-token prompts (prefill chunks end
// at multiples of the GDN chunk, 64); a KV cache that holds one request but not all eight
// preempts. Either way the tokens stay those of each request alone.
TEST_F(GenerateEngineTest, ChunkedPrefillAndPreemptionKeepTheTokens) {
  const std::string model = Model("qwen3_next");
  std::mt19937 rng(23);
  std::vector<json> lines;
  for (int i = 0; i < 8; ++i) {
    lines.push_back(
        {{"token_ids", RandomIds(rng, 100 + 5 * i, 512)}, {"max_tokens", 8}, {"ignore_eos", true}});
  }
  // max_model_len 160: a request (<= 143 tokens) needs at most 10 blocks of 16.
  const std::string engine_flags = "--max-num-seqs 8 --max-model-len 160 --block-size 16";
  std::string err;
  const json chunked =
      GenerateLines(model, lines, engine_flags + " --max-num-batched-tokens 64", &err);
  ExpectSameAsAlone(model, lines, chunked);

  // 12 blocks, from the bytes per block of the logged layout. A budget of 192 lets a second
  // request start (a 64-token chunk) beside the first one's prefill; when the first decodes and
  // the second needs its next blocks, the pool is dry and the second is preempted.
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(err, m, std::regex(R"((\d+) KV blocks of 16 tokens \((\d+) bytes)")))
      << err;
  const double bytes_per_block = std::stod(m[2]) / std::stod(m[1]);
  const std::string kv = fmt::format("{:.12g}", (12 + 0.5) * bytes_per_block / (1 << 30));
  const json preempted = GenerateLines(
      model, lines, engine_flags + " --max-num-batched-tokens 192 --kv-cache-memory " + kv, &err);
  EXPECT_NE(err.find(" 12 KV blocks"), std::string::npos) << err;
  ASSERT_EQ(preempted.size(), lines.size());
  int64_t preemptions = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(preempted[i]["token_ids"], chunked[i]["token_ids"]) << i;
    preemptions += preempted[i]["num_preemptions"].get<int64_t>();
  }
  EXPECT_GT(preemptions, 0);

  // A cache that cannot hold one request of --max-model-len is a usage error.
  const CommandResult r = Run(fmt::format(
      "generate --model {} --token-ids 1,2 {} --kv-cache-memory 0.0000001", model, engine_flags));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--kv-cache-memory"), std::string::npos) << r.err;
}

// Attention-only model with prefix caching: requests sharing a prompt prefix give what each
// gives alone. A token budget of 48 spreads the prefills over steps, so later requests find the
// blocks earlier ones published.
TEST_F(GenerateEngineTest, SharedPrefixesWithPrefixCaching) {
  const std::string model = Model("qwen3");
  std::mt19937 rng(31);
  const std::vector<int32_t> prefix = RandomIds(rng, 40, 512);
  std::vector<json> lines;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> ids = prefix;
    for (int32_t id : RandomIds(rng, 3 + 7 * i, 512)) ids.push_back(id);
    lines.push_back({{"token_ids", ids}, {"max_tokens", 5}, {"ignore_eos", true}});
  }
  lines.push_back(lines[0]);  // the same prompt twice
  std::string err;
  const json together =
      GenerateLines(model, lines, "--max-model-len 128 --max-num-batched-tokens 48", &err);
  EXPECT_NE(err.find("prefix caching on"), std::string::npos) << err;
  ExpectSameAsAlone(model, lines, together);
  EXPECT_EQ(together[4]["token_ids"], together[0]["token_ids"]);
  int64_t cached = 0;
  for (const json& r : together) cached += r["num_cached_tokens"].get<int64_t>();
  EXPECT_GT(cached, 0);
}

// A single prompt keeps --dump-activations working under the engine: one file set per step.
TEST_F(GenerateEngineTest, DumpActivationsPerStep) {
  const fs::path dump = Path("dump");
  const CommandResult r =
      Run(fmt::format("generate --model {} --token-ids 1,2,3 --max-tokens 3 "
                      "--ignore-eos --dump-activations {}",
                      Model("qwen3_next"), dump.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Prefill of 3 tokens, then two decode steps of one.
  EXPECT_EQ(fs::file_size(dump / "step0.L00.input_norm.f32"), 3u * 256u * 4u);
  EXPECT_EQ(fs::file_size(dump / "step2.L00.input_norm.f32"), 1u * 256u * 4u);
  EXPECT_FALSE(fs::exists(dump / "step3.L00.input_norm.f32"));
}

// Sampling with a seed repeats: across runs, and whether a request runs alone (through the
// flags) or among seven others, as each request has its own generator. Another seed, or greedy
// decoding, gives other tokens.
TEST_F(GenerateEngineTest, SeededSamplingIsReproducible) {
  const std::string model = Model("qwen3_next");
  std::mt19937 rng(41);
  std::vector<json> lines;
  for (int i = 0; i < 8; ++i) {
    json line = {{"token_ids", RandomIds(rng, 5 + 9 * i, 512)},
                 {"max_tokens", 8},
                 {"ignore_eos", true},
                 {"temperature", 0.9},
                 {"seed", 100 + i}};
    // Each processor somewhere: the flags of the runs alone cover them all.
    if (i % 4 == 1) line["top_k"] = 20;
    if (i % 4 == 2) line["top_p"] = 0.8;
    if (i % 4 == 3) line["min_p"] = 0.5;
    if (i == 4) line["presence_penalty"] = 1.5;
    if (i == 5) line["frequency_penalty"] = -1;
    if (i == 6) line["repetition_penalty"] = 1.3;
    lines.push_back(line);
  }
  const json together = GenerateLines(model, lines, "");
  ExpectSameAsAlone(model, lines, together);
  const json again = GenerateLines(model, lines, "--max-num-seqs 3");
  ASSERT_EQ(again.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(again[i]["token_ids"], together[i]["token_ids"]) << i;
  }

  json other_seed = lines[0];
  other_seed["seed"] = 7;
  EXPECT_NE(GenerateAlone(model, other_seed)["token_ids"], together[0]["token_ids"]);
  json greedy = lines[0];
  greedy.erase("temperature");
  EXPECT_NE(GenerateAlone(model, greedy)["token_ids"], together[0]["token_ids"]);
}

// n = 3 with a seed gives three choices, those of seeds s, s + 1, s + 2 each run with n = 1
// (vLLM's fan-out). Requests come in line order, then choice order.
TEST_F(GenerateEngineTest, ParallelSamplingFansOutSeeds) {
  const std::string model = Model("qwen3_next");
  const json base = {
      {"token_ids", {5, 6, 7, 8}}, {"max_tokens", 6}, {"ignore_eos", true}, {"temperature", 1}};
  json three = base;
  three["n"] = 3;
  three["seed"] = 17;
  json one = base;
  one["seed"] = 1;
  const json requests = GenerateLines(model, {three, one}, "");
  ASSERT_EQ(requests.size(), 4u);
  for (int c = 0; c < 3; ++c) {
    SCOPED_TRACE(c);
    EXPECT_EQ(requests[c]["index"], 0);
    EXPECT_EQ(requests[c]["choice"], c);
    json alone = base;
    alone["seed"] = 17 + c;
    EXPECT_EQ(requests[c]["token_ids"], GenerateAlone(model, alone)["token_ids"]);
  }
  EXPECT_NE(requests[0]["token_ids"], requests[1]["token_ids"]);
  EXPECT_EQ(requests[3]["index"], 1);
  EXPECT_EQ(requests[3]["choice"], 0);

  // Plain output labels a choice "[index.choice]" when the request has several.
  const fs::path file = Path("choices.jsonl");
  WriteFile(file, three.dump() + "\n" + one.dump() + "\n");
  const CommandResult r =
      Run(fmt::format("generate --model {} --prompts-file {}", model, file.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [label, request] :
       {std::pair{"[0.0] ", requests[0]}, {"[0.2] ", requests[2]}, {"[1] ", requests[3]}}) {
    EXPECT_NE(r.out.find(label + request["text"].get<std::string>() + "\n"), std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.err.find("generate: 4 requests, 24 generated tokens"), std::string::npos) << r.err;
}

// A stop string ends the request where it first appears: the text ends before it (or with it,
// include_stop_str_in_output), the tokens run up to the one that completed it, and the finish
// reason is "stop". Stop strings need the tokenizer.
TEST_F(GenerateEngineTest, StopStringsCutTheText) {
  const std::string model = Model("qwen3_next");
  const json base = {{"token_ids", {10, 20, 30}}, {"max_tokens", 16}, {"ignore_eos", true}};
  const json reference = GenerateAlone(model, base);
  const std::string text = reference["text"];
  // Two letters or digits from the second half of the text (no quoting in the shell).
  std::string stop;
  for (size_t p = text.size() / 2; p + 1 < text.size() && stop.empty(); ++p) {
    if (std::isalnum(static_cast<unsigned char>(text[p])) &&
        std::isalnum(static_cast<unsigned char>(text[p + 1]))) {
      stop = text.substr(p, 2);
    }
  }
  ASSERT_FALSE(stop.empty()) << text;
  const size_t at = text.find(stop);

  json cut = base;
  cut["stop"] = stop;
  json kept = base;
  kept["stop"] = {"~~~", stop};
  kept["include_stop_str_in_output"] = true;
  const json together = GenerateLines(model, {cut, kept}, "");
  ASSERT_EQ(together.size(), 2u);
  EXPECT_EQ(together[0]["text"], text.substr(0, at));
  EXPECT_EQ(together[1]["text"], text.substr(0, at + stop.size()));
  for (const json& r : together) {
    EXPECT_EQ(r["finish_reason"], "stop");
    EXPECT_EQ(r["token_ids"], together[0]["token_ids"]);
  }
  // The flags (--stop, one string) say the same as the lines.
  json kept_by_flags = cut;
  kept_by_flags["include_stop_str_in_output"] = true;
  for (const auto& [line, expected] : {std::pair{cut, together[0]}, {kept_by_flags, together[1]}}) {
    const json alone = GenerateAlone(model, line);
    EXPECT_EQ(alone["text"], expected["text"]);
    EXPECT_EQ(alone["token_ids"], expected["token_ids"]);
    EXPECT_EQ(alone["finish_reason"], "stop");
  }

  // The tokens are the reference's up to the one whose text completes the stop string.
  std::vector<int32_t> tokens = together[0]["token_ids"];
  ASSERT_FALSE(tokens.empty());
  ASSERT_LT(tokens.size(), reference["token_ids"].size());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(tokens[i], reference["token_ids"][i]) << i;
  for (const bool whole : {true, false}) {
    if (!whole) tokens.pop_back();
    if (tokens.empty()) break;
    const CommandResult r = Run(
        fmt::format("detokenize --model {} --no-special --ids {}", model, JoinIds(json(tokens))));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find(stop) != std::string::npos, whole) << r.out;
  }

  // A folder without a tokenizer cannot match text: a runtime failure naming the parameter.
  const fs::path bare = Path("no_tokenizer");
  fs::create_directories(bare);
  for (const char* file : {"config.json", "model.safetensors"}) {
    fs::create_symlink(fs::path(model) / file, bare / file);
  }
  const CommandResult r =
      Run(fmt::format("generate --model {} --token-ids 1,2 --stop ab", bare.string()));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--stop needs the model's tokenizer"), std::string::npos) << r.err;
}

// Checks one logprobs position: its token, a logprob <= 0 and a rank >= 1, then top_n entries
// sorted by descending logprob, the token's own entry agreeing where it appears.
void ExpectPosition(const json& position, const json& token, size_t top_n) {
  EXPECT_EQ(position["token"], token);
  EXPECT_LE(position["logprob"].get<double>(), 0.0);
  EXPECT_GE(position["rank"].get<int64_t>(), 1);
  const json& top = position["top"];
  ASSERT_EQ(top.size(), top_n) << position.dump();
  for (size_t k = 0; k < top.size(); ++k) {
    EXPECT_LE(top[k]["logprob"].get<double>(), 0.0);
    if (k == 0) {
      EXPECT_EQ(top[k]["rank"], 1);
    } else {
      EXPECT_GE(top[k - 1]["logprob"].get<double>(), top[k]["logprob"].get<double>());
    }
    if (top[k]["token"] == token) {
      EXPECT_EQ(top[k]["logprob"], position["logprob"]);
      EXPECT_EQ(top[k]["rank"], position["rank"]);
    }
  }
}

// logprobs: per output token the token's logprob and rank plus the N most likely tokens; for
// greedy decoding the token is the most likely one. prompt_logprobs: one entry per prompt token,
// null for the first. Asking for them does not change the tokens.
TEST_F(GenerateEngineTest, LogprobsAndPromptLogprobs) {
  const std::string model = Model("qwen3_next");
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9};
  const json base = {{"token_ids", prompt}, {"max_tokens", 5}, {"ignore_eos", true}};
  json greedy = base;
  greedy["logprobs"] = 3;
  greedy["prompt_logprobs"] = 2;
  json sampled = base;
  sampled["temperature"] = 1;
  sampled["seed"] = 3;
  json sampled_logprobs = sampled;
  sampled_logprobs["logprobs"] = 0;
  json whole_vocab = base;
  whole_vocab["logprobs"] = -1;
  const json requests =
      GenerateLines(model, {greedy, base, sampled_logprobs, sampled, whole_vocab}, "");
  ASSERT_EQ(requests.size(), 5u);

  const json& g = requests[0];
  EXPECT_EQ(g["token_ids"], requests[1]["token_ids"]);
  ASSERT_EQ(g["logprobs"].size(), g["token_ids"].size());
  for (size_t i = 0; i < g["logprobs"].size(); ++i) {
    SCOPED_TRACE(i);
    const json& position = g["logprobs"][i];
    ExpectPosition(position, g["token_ids"][i], 3);
    EXPECT_EQ(position["rank"], 1);
    EXPECT_EQ(position["top"][0]["token"], g["token_ids"][i]);
  }
  ASSERT_EQ(g["prompt_logprobs"].size(), prompt.size());
  EXPECT_TRUE(g["prompt_logprobs"][0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectPosition(g["prompt_logprobs"][i], prompt[i], 2);
  }

  const json& s = requests[2];
  EXPECT_EQ(s["token_ids"], requests[3]["token_ids"]);
  EXPECT_FALSE(s.contains("prompt_logprobs"));
  ASSERT_EQ(s["logprobs"].size(), s["token_ids"].size());
  for (size_t i = 0; i < s["logprobs"].size(); ++i) {
    ExpectPosition(s["logprobs"][i], s["token_ids"][i], 0);
  }
  EXPECT_FALSE(requests[1].contains("logprobs"));
  EXPECT_FALSE(requests[1].contains("prompt_logprobs"));

  // -1: the whole vocabulary, whose probabilities sum to 1.
  for (const json& position : requests[4]["logprobs"]) {
    ASSERT_EQ(position["top"].size(), 512u);
    double sum = 0;
    for (const json& t : position["top"]) sum += std::exp(t["logprob"].get<double>());
    EXPECT_NEAR(sum, 1.0, 1e-3);
  }
}

// allowed_token_ids, logit_bias and bad_words act on the tokens as vLLM's processors.
TEST_F(GenerateEngineTest, TokenConstraintsFromLines) {
  const std::string model = Model("qwen3_next");
  // "the" is one token; bad_words ["the"] bans it and " the" (a different single token).
  std::vector<int32_t> banned;
  for (const char* word : {"the", " the"}) {
    const CommandResult r = Run(fmt::format("tokenize --model {} --json --text '{}'", model, word));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json ids = json::parse(r.out)["ids"];
    ASSERT_EQ(ids.size(), 1u) << word;
    banned.push_back(ids[0]);
  }
  const json base = {{"token_ids", {40, 41, 42}}, {"max_tokens", 6}, {"ignore_eos", true}};
  json allowed = base;
  allowed["temperature"] = 1;
  allowed["seed"] = 5;
  allowed["allowed_token_ids"] = {7, 70, 300};
  json biased = base;
  biased["logit_bias"] = {{std::to_string(banned[0]), 100}};
  json biased_banned = biased;
  biased_banned["bad_words"] = {"the"};
  const json requests = GenerateLines(model, {allowed, biased, biased_banned}, "");
  ASSERT_EQ(requests.size(), 3u);
  for (const json& id : requests[0]["token_ids"]) {
    EXPECT_TRUE(id == 7 || id == 70 || id == 300) << id;
  }
  EXPECT_EQ(requests[1]["token_ids"], json(std::vector<int32_t>(6, banned[0])));
  for (const json& id : requests[2]["token_ids"]) {
    EXPECT_TRUE(id != banned[0] && id != banned[1]) << id;
  }
}

}  // namespace
}  // namespace moeserve
