// Bounded cost per request (issue #31) through the real `moeserve serve` on the default model
// (vocabulary 8192), its bounds set low by flags: for each, a request at the bound is served and
// one past it is a 400 whose message names the flag. Also: a prompt that cannot fit is refused
// before it is encoded, an unknown model's 404 quotes a bounded name, response_format other than
// text is refused, chat content parts are joined as vLLM joins them, other part types are
// refused, and the flags themselves are checked.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kVocab = 8192;
constexpr int kMaxModelLen = 256;
constexpr int kMaxNumSeqs = 4;  // the KV cache: 4 requests of 256 tokens = 1024 tokens

class RequestLimitsTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        fmt::format("moeserve_request_limits_{}", getpid()));
    fs::create_directories(*dir_);
    server_ = new e2e::ServerProcess(
        {"--max-model-len", std::to_string(kMaxModelLen), "--max-num-seqs",
         std::to_string(kMaxNumSeqs), "--max-logprobs", "5", "--max-choices-per-request", "8",
         "--max-stop-bytes", "100", "--max-response-mib", "1"},
        *dir_ / "serve.err");
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(server_->ok()) << server_->log(); }

  // Status and parsed body.
  // `port`: another server's (0: the suite's).
  static std::pair<int, json> Post(const std::string& path, const json& body, int port = 0) {
    httplib::Client c("127.0.0.1", port != 0 ? port : server_->port());
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    if (!r) return {-1, nullptr};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  static void ExpectServed(const std::string& path, const json& body, int port = 0) {
    const auto [status, answer] = Post(path, body, port);
    EXPECT_EQ(status, 200) << body.dump().substr(0, 200) << " -> " << answer.dump().substr(0, 400);
  }

  // A 400 naming `param` whose message contains `names` (the flag).
  static void ExpectRefused(const std::string& path, const json& body, const json& param,
                            const std::string& names, int port = 0) {
    const auto [status, answer] = Post(path, body, port);
    EXPECT_EQ(status, 400) << body.dump().substr(0, 200);
    ASSERT_TRUE(answer.is_object() && answer.contains("error")) << answer.dump().substr(0, 400);
    EXPECT_EQ(answer["error"]["param"], param) << answer.dump().substr(0, 400);
    EXPECT_NE(answer["error"]["message"].get<std::string>().find(names), std::string::npos)
        << answer.dump().substr(0, 400);
  }

  static json Prompt(int length) {
    std::vector<int> ids(length);
    for (int i = 0; i < length; ++i) ids[i] = 100 + (i * 37) % 5000;
    return ids;
  }

  static json Chat(json content) {
    return {{"messages", json::array({{{"role", "user"}, {"content", std::move(content)}}})},
            {"max_tokens", 8},
            {"temperature", 0}};
  }

  static fs::path* dir_;
  static e2e::ServerProcess* server_;
};

fs::path* RequestLimitsTest::dir_ = nullptr;
e2e::ServerProcess* RequestLimitsTest::server_ = nullptr;

TEST_F(RequestLimitsTest, MaxLogprobs) {
  const json prompt = Prompt(10);
  ExpectServed("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"logprobs", 5}});
  ExpectRefused("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"logprobs", 6}},
                "logprobs", "--max-logprobs");
  ExpectRefused("/v1/completions", {{"prompt", prompt}, {"max_tokens", 2}, {"logprobs", -1}},
                "logprobs", "--max-logprobs");
  ExpectServed("/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"prompt_logprobs", 5}});
  ExpectRefused("/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"prompt_logprobs", -1}},
                "prompt_logprobs", "--max-logprobs");
  json chat = Chat("Elizabeth was");
  chat["logprobs"] = true;
  chat["top_logprobs"] = 5;
  ExpectServed("/v1/chat/completions", chat);
  chat["top_logprobs"] = 6;
  ExpectRefused("/v1/chat/completions", chat, "top_logprobs", "--max-logprobs");
}

TEST_F(RequestLimitsTest, MaxChoicesPerRequest) {
  const json two_prompts = {Prompt(5), Prompt(6)};
  const json at = {{"prompt", two_prompts}, {"n", 4}, {"max_tokens", 1}, {"temperature", 1}};
  const auto [status, answer] = Post("/v1/completions", at);
  ASSERT_EQ(status, 200) << answer.dump().substr(0, 400);
  EXPECT_EQ(answer["choices"].size(), 8u);
  json past = at;
  past["n"] = 5;
  ExpectRefused("/v1/completions", past, "n", "--max-choices-per-request");
  // The attack's shape: many prompts, huge n -- refused at once, however large.
  ExpectRefused("/v1/completions",
                {{"prompt", std::vector<std::string>(64, "a")}, {"n", 16384}, {"max_tokens", 1}},
                "n", "--max-choices-per-request");
}

TEST_F(RequestLimitsTest, MaxStopBytes) {
  const json prompt = Prompt(10);
  ExpectServed("/v1/completions", {{"prompt", prompt},
                                   {"max_tokens", 2},
                                   {"stop", {std::string(60, 'x'), std::string(40, 'y')}}});
  ExpectRefused("/v1/completions",
                {{"prompt", prompt},
                 {"max_tokens", 2},
                 {"stop", {std::string(60, 'x'), std::string(41, 'y')}}},
                "stop", "--max-stop-bytes");
  ExpectRefused("/v1/completions",
                {{"prompt", prompt}, {"max_tokens", 2}, {"stop", std::string(1 << 20, 'x')}},
                "stop", "--max-stop-bytes");
}

TEST_F(RequestLimitsTest, TokenListsAtMostTheVocabulary) {
  json bias = json::object();
  for (int id = 0; id < kVocab; ++id) bias[std::to_string(id)] = id % 3 == 0 ? -1 : 1;
  // Every token biased, in 8 choices: served (the biases are de-duplicated once).
  ExpectServed("/v1/completions", {{"prompt", Prompt(5)},
                                   {"n", 8},
                                   {"max_tokens", 2},
                                   {"temperature", 1},
                                   {"logit_bias", bias}});
  bias["007"] = 5;  // token 7 again
  ExpectRefused("/v1/completions", {{"prompt", Prompt(5)}, {"max_tokens", 2}, {"logit_bias", bias}},
                "logit_bias", "vocabulary");
  std::vector<int> ids(kVocab);
  for (int id = 0; id < kVocab; ++id) ids[id] = id;
  ExpectServed("/v1/completions",
               {{"prompt", Prompt(5)}, {"max_tokens", 2}, {"allowed_token_ids", ids}});
  ids.push_back(1);
  ExpectRefused("/v1/completions",
                {{"prompt", Prompt(5)}, {"max_tokens", 2}, {"allowed_token_ids", ids}},
                "allowed_token_ids", "vocabulary");
}

// Needs the server to give the checks its KV cache's size (RequestContext::kv_cache_tokens).
TEST_F(RequestLimitsTest, ChoicesTokensAtMostTheKvCache) {
  // 4 choices of 16 + 240 tokens: the whole cache of 4 x 256 tokens.
  const json at = {{"prompt", Prompt(16)},
                   {"n", kMaxNumSeqs},
                   {"max_tokens", kMaxModelLen - 16},
                   {"temperature", 1},
                   {"stop", "\n"}};
  ExpectServed("/v1/completions", at);
  json past = at;
  past["n"] = kMaxNumSeqs + 1;
  ExpectRefused("/v1/completions", past, "max_tokens", "--kv-cache-memory");
}

TEST_F(RequestLimitsTest, MaxResponseMib) {
  // A server whose KV cache holds 8 choices of 256 tokens (the suite's holds 4: the bound on
  // answer bytes could not be reached within it).
  e2e::ServerProcess big({"--max-model-len", std::to_string(kMaxModelLen), "--max-num-seqs", "8",
                          "--max-logprobs", "5", "--max-response-mib", "1"},
                         *dir_ / "big.err");
  ASSERT_TRUE(big.ok()) << big.log();
  // 8 choices of a 240-token prompt with 5 prompt logprobs: ~0.7 MiB reckoned.
  const json at = {{"prompt", Prompt(240)},
                   {"n", 8},
                   {"temperature", 1},
                   {"max_tokens", 1},
                   {"prompt_logprobs", 5}};
  ExpectServed("/v1/completions", at, big.port());
  // Echoed with logprobs too: the prompt's logprobs go out twice per choice, ~1.5 MiB.
  json past = at;
  past["echo"] = true;
  past["logprobs"] = 5;
  ExpectRefused("/v1/completions", past, nullptr, "--max-response-mib", big.port());
  EXPECT_EQ(big.Stop(), 0) << big.log();
}

TEST_F(RequestLimitsTest, PromptsThatCannotFitAreRefusedUnencoded) {
  const auto start = std::chrono::steady_clock::now();
  ExpectRefused("/v1/completions", {{"prompt", std::string(1 << 20, 'a')}, {"max_tokens", 1}},
                "prompt", "--max-model-len");
  ExpectRefused("/v1/chat/completions", Chat(std::string(1 << 20, 'a')), "messages",
                "--max-model-len");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
}

// Needs the server's /tokenize to be TokenizeResponse (tokenize_api.h).
TEST_F(RequestLimitsTest, TokenizeChecksTheLengthFirst) {
  const auto [status, answer] = Post("/tokenize", {{"prompt", std::string(1 << 20, 'a')}});
  EXPECT_EQ(status, 400) << answer.dump().substr(0, 400);
  EXPECT_NE(answer.dump().find("--max-model-len"), std::string::npos)
      << answer.dump().substr(0, 400);
  const auto [parts_status, parts] =
      Post("/tokenize",
           {{"messages",
             json::array(
                 {{{"role", "user"},
                   {"content", json::array({{{"type", "text"}, {"text", "Elizabeth was"}}})}}})}});
  const auto [plain_status, plain] = Post(
      "/tokenize", {{"messages", json::array({{{"role", "user"}, {"content", "Elizabeth was"}}})}});
  ASSERT_EQ(parts_status, 200) << parts.dump().substr(0, 400);
  ASSERT_EQ(plain_status, 200) << plain.dump().substr(0, 400);
  EXPECT_EQ(parts["tokens"], plain["tokens"]);
}

TEST_F(RequestLimitsTest, UnknownModelIsQuotedShort) {
  httplib::Client c("127.0.0.1", server_->port());
  auto r =
      c.Post("/v1/completions", json{{"prompt", "x"}, {"model", std::string(1 << 20, 'm')}}.dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_LT(r->body.size(), 1024u) << r->body.substr(0, 1024);
}

// Structured output is enforced; what cannot be (an unknown format type, a schema keyword not
// enforced, a spec past a compile bound, a left-recursive grammar) is a 400 naming it, and the
// server goes on serving.
TEST_F(RequestLimitsTest, StructuredOutputPastItsBoundsIsRefused) {
  json chat = Chat("Elizabeth was");
  chat["response_format"] = {{"type", "text"}};
  ExpectServed("/v1/chat/completions", chat);
  chat["response_format"] = {{"type", "json_object"}};
  ExpectServed("/v1/chat/completions", chat);
  chat["response_format"] = {{"type", "structural_tag"}};
  ExpectRefused("/v1/chat/completions", chat, "response_format", "structural_tag");
  chat.erase("response_format");
  struct Hostile {
    json keys;
    std::string param;
    std::string says;
  };
  const Hostile hostile[] = {
      {{{"guided_json", {{"type", "object"}, {"patternProperties", json::object()}}}},
       "structured_outputs",
       "patternProperties"},
      {{{"guided_regex", "(.{0,60}){60}"}}, "structured_outputs", "max_"},
      {{{"guided_regex", std::string(300 * 1024, 'a')}}, "structured_outputs", "max_spec_bytes"},
      {{{"guided_grammar", "root ::= root \"a\" | \"b\""}}, "structured_outputs", "recursi"},
      {{{"guided_choice", json::array()}}, "guided_choice", "guided_choice"},
      {{{"structured_outputs", {{"regex", "a"}, {"grammar", "root ::= \"a\""}}}},
       "structured_outputs",
       "one of"},
  };
  for (const Hostile& h : hostile) {
    json request = chat;
    request.update(h.keys);
    ExpectRefused("/v1/chat/completions", request, h.param, h.says);
  }
  ExpectServed("/v1/chat/completions", Chat("Elizabeth was"));
}

TEST_F(RequestLimitsTest, ContentPartsAreJoinedAsVllmJoinsThem) {
  const auto [plain_status, plain] = Post("/v1/chat/completions", Chat("Elizabeth was\nhappy"));
  const auto [parts_status, parts] =
      Post("/v1/chat/completions", Chat(json::array({{{"type", "text"}, {"text", "Elizabeth was"}},
                                                     {{"type", "text"}, {"text", "happy"}}})));
  ASSERT_EQ(plain_status, 200) << plain.dump();
  ASSERT_EQ(parts_status, 200) << parts.dump();
  EXPECT_EQ(parts["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);
  EXPECT_EQ(parts["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"]);
  for (const char* type : {"image_url", "input_audio", "file"}) {
    ExpectRefused("/v1/chat/completions", Chat(json::array({{{"type", type}}})), "messages", type);
  }
}

TEST(RequestLimitFlagsTest, BadBoundsAreUsageErrors) {
  const fs::path err = fs::temp_directory_path() / fmt::format("request_limits_{}.err", getpid());
  for (const std::string flag :
       {"--max-logprobs -2", "--max-choices-per-request 0", "--max-choices-per-request 99999",
        "--max-stop-bytes -1", "--max-response-mib 0", "--max-response-mib 99999999999"}) {
    const e2e::CommandResult r = e2e::RunMoeserve("serve " + flag, err);
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_NE(r.err.find(flag.substr(0, flag.find(' '))), std::string::npos)
        << flag << ": " << r.err;
  }
  fs::remove(err);
}

}  // namespace
}  // namespace moeserve
