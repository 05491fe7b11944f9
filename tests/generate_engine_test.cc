// Runs `moeserve generate` and `moeserve bench latency` through the engine as a user would, on
// tiny random models: many concurrent requests give, token for token, what each gives alone
// (also under chunked prefill and preemption), and bad --prompts-file lines exit 2 naming the
// line and the problem.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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

  // The request of `line` run alone: through --token-ids and flags where the line has only
  // what flags can say, else as a one-line --prompts-file.
  static json GenerateAlone(const std::string& model, const json& line) {
    if (line.contains("stop_token_ids") || line.contains("prompt")) {
      return GenerateLines(model, {line}, "")[0];
    }
    std::string flags = "--token-ids " + JoinIds(line["token_ids"]);
    if (line.contains("max_tokens"))
      flags += fmt::format(" --max-tokens {}", line["max_tokens"].dump());
    if (line.contains("min_tokens"))
      flags += fmt::format(" --min-tokens {}", line["min_tokens"].dump());
    if (line.value("ignore_eos", false)) flags += " --ignore-eos";
    const CommandResult r = Run(fmt::format("generate --model {} --json {}", model, flags));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["requests"][0] : json();
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

// (c) Bad lines: exit 2 and one line naming the file line and the problem, before the model
// loads. Greedy values of the sampling parameters are accepted.
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
      {R"({"prompt": "hi", "token_ids": [1]})", "exactly one of \"prompt\" and \"token_ids\""},
      {R"({"max_tokens": 3})", "exactly one of \"prompt\" and \"token_ids\""},
      {R"({"token_ids": [1], "temperature": 0.7})", "\"temperature\": 0.7 needs sampling"},
      {R"({"token_ids": [1], "top_k": 5})", "\"top_k\": 5 needs sampling"},
      {R"({"token_ids": [1, 512]})", "\"token_ids\": 512 is outside the vocabulary [0, 512)"},
      {R"({"token_ids": [1, "a"]})", "\"token_ids\": \"a\" is not an integer"},
      {R"({"token_ids": []})", "\"token_ids\" is empty"},
      {R"({"token_ids": [1], "max_tokens": "5"})", "\"max_tokens\" must be an integer"},
      {R"({"token_ids": [1], "max_tokens": 0})", "\"max_tokens\" must be >= 1"},
      {R"({"token_ids": [1], "ignore_eos": 1})", "\"ignore_eos\" must be true or false"},
      {R"({"token_ids": [1], "max_tokens": 2, "min_tokens": 3})", "exceeds \"max_tokens\""},
      {R"({"token_ids": [1], "stop_token_ids": [600]})", "\"stop_token_ids\": 600 is outside"},
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
           {"--token-ids 1 --temperature 0.7", "--temperature: 0.7 needs sampling"},
           {"--token-ids 1 --top-p 0.9", "--top-p: 0.9 needs sampling"},
           {"--token-ids 1 --prompts-file " + file.string(), "exactly one of"},
           {"--token-ids 1 --max-num-seqs 0", "--max-num-seqs"},
           {"--token-ids 1 --kv-cache-memory -1", "--kv-cache-memory"},
           {"--token-ids 1 --block-size 0", "--block-size"},
           {"--token-ids 1 --max-model-len 100000", "--max-model-len"},
           {"--token-ids 1 --min-tokens 20 --max-tokens 4", "--min-tokens 20 exceeds"},
           {"--prompts-file " + file.string() + " --dump-activations /tmp/x", "single prompt"},
       }) {
    const CommandResult r = Run(fmt::format("generate --model {} {}", Model("qwen3_next"), flags));
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(expected), std::string::npos) << flags << ": " << r.err;
  }

  WriteFile(file, R"({"token_ids": [1, 2], "temperature": 0, "top_p": 1, "top_k": -1, )"
                  R"("min_p": 0, "seed": 7, "max_tokens": null})"
                  "\n");
  const CommandResult r =
      Run(fmt::format("generate --model {} --json --ignore-eos "
                      "--max-tokens 5 --prompts-file {}",
                      Model("qwen3_next"), file.string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // "max_tokens": null is "not given": the flags' defaults apply.
  EXPECT_EQ(json::parse(r.out)["requests"][0]["token_ids"].size(), 5u);
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

}  // namespace
}  // namespace moeserve
