// Runs the real `moeserve serve` on a tiny random model and drives it over HTTP as an OpenAI
// client would: greedy completions and chats equal `moeserve generate` on the same prompt ids,
// streams concatenate to the non-stream text, n / seed / logprobs / stop strings act as vLLM's,
// bad requests get vLLM's status and error body while the server keeps serving, a client that
// disconnects mid-stream is aborted, and SIGTERM exits 0.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_binary.h"
#include "tests/server_process.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kApiKey[] = "test-key";
constexpr int kMaxModelLen = 256;

// The "data: " payloads of an SSE body, in order.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    events.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return events;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("moeserve_server_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    const e2e::CommandResult made = e2e::RunMoeserve(
        fmt::format("make-model --arch qwen3_next --preset tiny --seed 3 --out {}", Model()),
        *dir_ / "make_model.err");
    ASSERT_EQ(made.exit_code, 0) << made.err;

    server_ =
        new e2e::ServerProcess({"--model", Model(), "--max-model-len", std::to_string(kMaxModelLen),
                                "--api-key", kApiKey, "--served-model-name", "tiny"},
                               *dir_ / "serve.err");
    port_ = server_->port();
    ASSERT_TRUE(server_->ok()) << "the server did not become healthy: " << server_->log();
  }

  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      // Graceful shutdown: SIGTERM ends the server with exit code 0.
      const int exit_code = server_->Stop();
      EXPECT_EQ(exit_code, 0) << "serve did not exit 0 on SIGTERM:\n" << server_->log();
      delete server_;
    }
    fs::remove_all(*dir_);
    delete dir_;
  }

  static std::string Model() { return (*dir_ / "model").string(); }

  static httplib::Client Client(bool with_key = true) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    if (with_key) c.set_bearer_token_auth(kApiKey);
    return c;
  }

  // POSTs `body` (JSON text as given); the status and the body.
  static std::pair<int, std::string> Post(const std::string& path, const std::string& body,
                                          bool with_key = true) {
    httplib::Client c = Client(with_key);
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) return {-1, httplib::to_string(r.error())};
    return {r->status, r->body};
  }

  static json PostJson(const std::string& path, const json& body) {
    const auto [status, text] = Post(path, body.dump());
    EXPECT_EQ(status, 200) << text;
    return status == 200 ? json::parse(text) : json();
  }

  // POSTs `body` over a plain socket and reads the streamed response (raw, chunked) until
  // "data: [DONE]", or until it holds `max_events` SSE events and then hangs up: a client gone
  // mid-stream. Many httplib::Clients on threads of one process lose connections now and then
  // (httplib 0.11's client, not the server: plain sockets never do), hence plain sockets here.
  static std::string RawStream(const std::string& path, const std::string& body,
                               int max_events = std::numeric_limits<int>::max()) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    std::string received;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request = fmt::format(
          "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n"
          "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
          path, kApiKey, body.size(), body);
      if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
        char buf[4096];
        ssize_t n;
        while (static_cast<int>(SseData(received).size()) < max_events &&
               received.find("data: [DONE]") == std::string::npos &&
               (n = read(fd, buf, sizeof(buf))) > 0) {
          received.append(buf, static_cast<size_t>(n));
        }
      }
    }
    close(fd);
    return received;
  }

  // `generate --json` of prompt ids, greedy: the reference the server must match.
  static json Generate(const std::vector<int32_t>& ids, int max_tokens) {
    std::string joined;
    for (int32_t id : ids) {
      if (!joined.empty()) joined += ',';
      joined += std::to_string(id);
    }
    const e2e::CommandResult r = e2e::RunMoeserve(
        fmt::format("generate --model {} --token-ids {} --max-tokens {} --ignore-eos --json",
                    Model(), joined, max_tokens),
        *dir_ / "generate.err");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out)["requests"][0];
  }

  static fs::path* dir_;
  static int port_;
  static e2e::ServerProcess* server_;
};

fs::path* ServerTest::dir_ = nullptr;
int ServerTest::port_ = 0;
e2e::ServerProcess* ServerTest::server_ = nullptr;

const std::vector<int32_t> kPrompt = {5, 17, 42, 99, 3, 250, 7};

TEST_F(ServerTest, HealthModelsVersion) {
  httplib::Client c = Client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["object"], "model");
  EXPECT_EQ(m["data"][0]["max_model_len"], kMaxModelLen);
  auto version = c.Get("/version");
  ASSERT_TRUE(version);
  EXPECT_TRUE(json::parse(version->body)["version"].is_string());
}

TEST_F(ServerTest, CompletionMatchesGenerate) {
  const json ref = Generate(kPrompt, 12);
  const json r = PostJson("/v1/completions", {{"model", "tiny"},
                                              {"prompt", kPrompt},
                                              {"max_tokens", 12},
                                              {"temperature", 0},
                                              {"ignore_eos", true}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_TRUE(r["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_TRUE(r["created"].is_number_integer());
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["text"], ref["text"]);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], kPrompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], ref["token_ids"].size());
  EXPECT_EQ(r["usage"]["total_tokens"], kPrompt.size() + ref["token_ids"].size());
}

TEST_F(ServerTest, ChatMatchesGenerate) {
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", "Hello there"}}};
  const json tokens = PostJson("/tokenize", {{"messages", messages}});
  const std::vector<int32_t> ids = tokens["tokens"];
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(tokens["count"], ids.size());
  const json ref = Generate(ids, 10);
  const json r = PostJson(
      "/v1/chat/completions",
      {{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_TRUE(r["id"].get<std::string>().starts_with("chatcmpl-"));
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], ref["text"]);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 10);
}

TEST_F(ServerTest, CompletionStreamEqualsNonStream) {
  json request = {
      {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}, {"ignore_eos", true}};
  const json whole = PostJson("/v1/completions", request);
  request["stream"] = true;
  request["stream_options"] = {{"include_usage", true}};
  const auto [status, body] = Post("/v1/completions", request.dump());
  ASSERT_EQ(status, 200) << body;
  const std::vector<std::string> events = SseData(body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  int finishes = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    EXPECT_EQ(chunk["id"], json::parse(events[0])["id"]);
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(json::parse(events[events.size() - 3])["choices"][0]["finish_reason"], "length");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], whole["usage"]);
}

TEST_F(ServerTest, ChatStreamEqualsNonStream) {
  json request = {{"messages", {{{"role", "user"}, {"content", "Tell me a story"}}}},
                  {"max_tokens", 12},
                  {"temperature", 0},
                  {"ignore_eos", true}};
  const json whole = PostJson("/v1/chat/completions", request);
  request["stream"] = true;
  const auto [status, body] = Post("/v1/chat/completions", request.dump());
  ASSERT_EQ(status, 200) << body;
  const std::vector<std::string> events = SseData(body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json delta = json::parse(events[i])["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    // No usage chunk without stream_options.include_usage.
    EXPECT_FALSE(json::parse(events[i]).contains("usage"));
  }
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, NChoicesWithSeed) {
  const json request = {{"prompt", kPrompt}, {"max_tokens", 8},    {"temperature", 1.0},
                        {"seed", 7},         {"ignore_eos", true}, {"n", 2}};
  const json a = PostJson("/v1/completions", request);
  const json b = PostJson("/v1/completions", request);
  ASSERT_EQ(a["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a["choices"][i]["index"], i);
    EXPECT_EQ(a["choices"][i]["text"], b["choices"][i]["text"]);  // seeded: repeatable
  }
  EXPECT_EQ(a["usage"]["completion_tokens"], 16);
  // Choice 0 is seeded `seed` (FanOut: choice i gets seed + i), as a request with n = 1.
  json single = request;
  single["n"] = 1;
  EXPECT_EQ(PostJson("/v1/completions", single)["choices"][0]["text"], a["choices"][0]["text"]);
  // Streamed, each choice's deltas carry its index.
  json streamed = request;
  streamed["stream"] = true;
  const auto [status, body] = Post("/v1/completions", streamed.dump());
  ASSERT_EQ(status, 200);
  std::string texts[2];
  for (const std::string& e : SseData(body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    texts[c["index"].get<int>()] += c["text"].get<std::string>();
  }
  EXPECT_EQ(texts[0], a["choices"][0]["text"]);
  EXPECT_EQ(texts[1], a["choices"][1]["text"]);
}

// Structured output over HTTP: response_format's JSON Schema (chat, streamed too), vLLM's
// structured_outputs and guided_* keys hold for every choice; a schema the server cannot enforce
// is a 400 naming the keyword, and the server keeps serving.
TEST_F(ServerTest, StructuredOutputHoldsForEveryChoice) {
  // Ordered as a client writes it: "name" before "n" (nlohmann::json would sort them).
  const nlohmann::ordered_json schema = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}, {"maxLength", 6}}},
        {"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}}}},
      {"required", {"name", "n"}}};
  nlohmann::ordered_json chat = {
      {"messages", {{{"role", "user"}, {"content", "Who?"}}}},
      {"max_tokens", 120},
      {"temperature", 1.0},
      {"seed", 5},
      {"n", 3},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "who"}, {"schema", schema}, {"strict", true}}}}}};
  auto check = [](const std::string& text) {
    SCOPED_TRACE(text);
    EXPECT_EQ(text.rfind("{\"name\"", 0), 0u) << "properties in the schema's order, not sorted";
    const json v = json::parse(text, nullptr, false);
    ASSERT_TRUE(v.is_object());
    ASSERT_TRUE(v["name"].is_string());
    size_t characters = 0;
    for (unsigned char b : v["name"].get<std::string>()) characters += (b & 0xC0) != 0x80;
    EXPECT_LE(characters, 6u);
    ASSERT_TRUE(v["n"].is_number_integer());
    EXPECT_GE(v["n"].get<int>(), 0);
    EXPECT_LE(v["n"].get<int>(), 99);
    EXPECT_EQ(v.size(), 2u);
  };
  const auto [answer_status, answer_body] = Post("/v1/chat/completions", chat.dump());
  ASSERT_EQ(answer_status, 200) << answer_body;
  const json answer = json::parse(answer_body);
  ASSERT_EQ(answer["choices"].size(), 3u);
  std::vector<std::string> texts;
  for (const json& c : answer["choices"]) {
    ASSERT_EQ(c["finish_reason"], "stop") << c.dump();
    texts.push_back(c["message"]["content"]);
    check(texts.back());
  }
  chat["stream"] = true;
  const auto [status, body] = Post("/v1/chat/completions", chat.dump());
  ASSERT_EQ(status, 200) << body;
  std::string streamed[3];
  for (const std::string& e : SseData(body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    if (c["delta"].contains("content")) {
      streamed[c["index"].get<int>()] += c["delta"]["content"].get<std::string>();
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(streamed[i], texts[i]);

  const json regex =
      PostJson("/v1/completions", {{"prompt", kPrompt},
                                   {"max_tokens", 40},
                                   {"temperature", 1.0},
                                   {"structured_outputs", {{"regex", "[a-c]{2,4}!"}}}});
  const std::string r = regex["choices"][0]["text"];
  EXPECT_TRUE(r.size() >= 3 && r.size() <= 5 && r.back() == '!') << r;
  const json choice = PostJson("/v1/completions", {{"prompt", kPrompt},
                                                   {"max_tokens", 40},
                                                   {"temperature", 1.0},
                                                   {"guided_choice", {"left", "right"}}});
  const std::string c = choice["choices"][0]["text"];
  EXPECT_TRUE(c == "left" || c == "right") << c;

  const auto [bad_status, bad_body] =
      Post("/v1/completions",
           json{{"prompt", kPrompt}, {"guided_json", {{"not", {{"type", "null"}}}}}}.dump());
  EXPECT_EQ(bad_status, 400) << bad_body;
  EXPECT_NE(bad_body.find("not"), std::string::npos) << bad_body;
  EXPECT_EQ(PostJson("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}})["choices"].size(),
            1u);
}

// Requests from many connections at once are batched by the engine loop and give, token for
// token, what each gives alone.
TEST_F(ServerTest, ConcurrentRequestsMatchSequential) {
  std::vector<json> requests;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = kPrompt;
    prompt[0] = 10 + i;
    requests.push_back({{"prompt", prompt},
                        {"max_tokens", 10 + i},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"stream", i % 2 == 1}});
  }
  // The text of a response, streamed or not.
  const auto text_of = [](const std::string& body, bool stream) {
    if (!stream) return json::parse(body)["choices"][0]["text"].get<std::string>();
    std::string text;
    for (const std::string& e : SseData(body)) {
      if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
    }
    return text;
  };
  std::vector<std::string> alone;
  for (const json& r : requests) {
    const auto [status, body] = Post("/v1/completions", r.dump());
    ASSERT_EQ(status, 200) << body;
    alone.push_back(text_of(body, r["stream"]));
  }
  std::vector<std::string> together(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      const auto [status, body] = Post("/v1/completions", requests[i].dump());
      together[i] = status == 200 ? text_of(body, requests[i]["stream"]) : "HTTP error";
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(together, alone);
}

TEST_F(ServerTest, LogprobsShapes) {
  const json c = PostJson("/v1/completions", {{"prompt", kPrompt},
                                              {"max_tokens", 5},
                                              {"temperature", 0},
                                              {"ignore_eos", true},
                                              {"logprobs", 2}});
  const json lp = c["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << c.dump();
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  ASSERT_EQ(lp["text_offset"].size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_TRUE(lp["top_logprobs"][i].is_object());
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    if (i > 0) {
      EXPECT_GE(lp["text_offset"][i], lp["text_offset"][i - 1]);
    }
  }

  const json chat =
      PostJson("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                        {"max_tokens", 4},
                                        {"temperature", 0},
                                        {"ignore_eos", true},
                                        {"logprobs", true},
                                        {"top_logprobs", 3}});
  const json content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << chat.dump();
  for (const json& e : content) {
    EXPECT_TRUE(e["token"].is_string());
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    EXPECT_TRUE(e["bytes"].is_array());
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    for (const json& t : e["top_logprobs"]) {
      EXPECT_TRUE(t.contains("token") && t.contains("logprob") && t.contains("bytes"));
    }
  }
  // Greedy: the sampled token is the most likely one.
  EXPECT_EQ(content[0]["token"], content[0]["top_logprobs"][0]["token"]);
}

TEST_F(ServerTest, StopString) {
  const json request = {
      {"prompt", kPrompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string text = PostJson("/v1/completions", request)["choices"][0]["text"];
  // Two ASCII letters somewhere after the start make the stop string.
  std::string stop;
  for (size_t i = 1; i + 1 < text.size() && stop.empty(); ++i) {
    if (std::isalpha(static_cast<unsigned char>(text[i])) &&
        std::isalpha(static_cast<unsigned char>(text[i + 1]))) {
      stop = text.substr(i, 2);
    }
  }
  if (stop.empty()) GTEST_SKIP() << "no ASCII pair in " << text;
  json stopped = request;
  stopped["stop"] = stop;
  const json r = PostJson("/v1/completions", stopped);
  EXPECT_EQ(r["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, TokenizeDetokenize) {
  const json t = PostJson("/tokenize", {{"prompt", "hello world"}, {"return_token_strs", true}});
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["token_strs"].size(), t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], kMaxModelLen);
  EXPECT_EQ(PostJson("/detokenize", {{"tokens", t["tokens"]}})["prompt"], "hello world");
}

struct BadRequest {
  const char* path;
  std::string body;
  int status;
  const char* param;  // nullptr: null
};

TEST_F(ServerTest, BadRequestsGetVllmErrors) {
  const std::string long_prompt = json(std::vector<int32_t>(kMaxModelLen, 5)).dump();
  const std::vector<BadRequest> cases = {
      {"/v1/completions", "{\"prompt\": [1, 2", 400, nullptr},
      {"/v1/completions", "[1, 2]", 400, nullptr},
      {"/v1/completions", R"({"max_tokens": 5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": 12})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1, "a"]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": ""})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [1], "max_tokens": -1})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": [1], "max_tokens": "5"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": [1], "temperature": 3})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": [1], "top_p": 0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": [1], "top_k": 1.5})", 400, "top_k"},
      {"/v1/completions", R"({"prompt": [1], "n": 0})", 400, "n"},
      {"/v1/completions", R"({"prompt": [1], "stop": 5})", 400, "stop"},
      {"/v1/completions", R"({"prompt": [1], "stream": "yes"})", 400, "stream"},
      {"/v1/completions", R"({"prompt": [1], "stream_options": {"include_usage": true}})", 400,
       "stream_options"},
      {"/v1/completions", R"({"prompt": [1], "model": "other"})", 404, "model"},
      {"/v1/completions", R"({"prompt": [999999]})", 400, "prompt"},
      {"/v1/completions", "{\"prompt\": " + long_prompt + "}", 400, "input_tokens"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 255})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": [1], "logit_bias": [1]})", 400, "logit_bias"},
      {"/v1/chat/completions", R"({"max_tokens": 4})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"content": "no role"}]})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})",
       400, "logprobs"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 50, "logprobs": true})",
       400, "top_logprobs"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "model": 3})",
       400, "model"},
      {"/detokenize", R"({"tokens": [-1]})", 400, "tokens"},
  };
  for (const BadRequest& c : cases) {
    SCOPED_TRACE(fmt::format("{} {}", c.path, c.body.substr(0, 120)));
    const auto [status, body] = Post(c.path, c.body);
    EXPECT_EQ(status, c.status) << body;
    const json e = json::parse(body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    EXPECT_EQ(e["error"]["code"], c.status);
    if (c.param == nullptr) {
      EXPECT_TRUE(e["error"]["param"].is_null()) << body;
    } else {
      EXPECT_EQ(e["error"]["param"], c.param) << body;
    }
  }
  // Still serving.
  EXPECT_EQ(PostJson("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}})["choices"].size(),
            1u);
}

TEST_F(ServerTest, ApiKey) {
  const std::string body = json{{"prompt", kPrompt}, {"max_tokens", 2}}.dump();
  EXPECT_EQ(Post("/v1/completions", body, /*with_key=*/false).first, 401);
  httplib::Client wrong("127.0.0.1", port_);
  wrong.set_bearer_token_auth("nope");
  auto r = wrong.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"], "Unauthorized");
  auto models = Client(false).Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  // Outside /v1 no key is needed.
  auto health = Client(false).Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Post("/v1/completions", body).first, 200);
}

TEST_F(ServerTest, OversizedBodyIs413) {
  const std::string body =
      "{\"prompt\": \"" + std::string(17 << 20, 'a') + "\", \"max_tokens\": 1}";
  const auto [status, text] = Post("/v1/completions", body);
  EXPECT_EQ(status, 413);
  EXPECT_EQ(json::parse(text)["error"]["code"], 413) << text;
  EXPECT_EQ(Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 1}}.dump()).first,
            200);
}

// Found by a new user: a prompt nested 200,000 levels deep (400 KB, under the body limit) or a
// chat message whose content nests 100,000 levels ended the server with a stack overflow. Now
// each is a 400 naming the nesting, and the server keeps serving.
TEST_F(ServerTest, DeeplyNestedBodiesAre400) {
  const auto nested = [](int depth, const std::string& open, const std::string& close) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += open;
    for (int i = 0; i < depth; ++i) s += close;
    return s;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/completions", "{\"prompt\": " + nested(200000, "[", "]") + "}"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": )" + nested(100000, "[", "]") + "}]}"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": )" + nested(50000, R"({"a": )", "}") + "}]}"},
      {"/tokenize", R"({"prompt": )" + nested(100000, "[", "]") + "}"},
      // Just past the limit: the body is 129 levels deep.
      {"/v1/completions", R"({"prompt": [1], "logit_bias": )" + nested(128, "[", "]") + "}"},
  };
  for (const auto& [path, body] : cases) {
    SCOPED_TRACE(path + " " + body.substr(0, 80));
    const auto [status, text] = Post(path, body);
    EXPECT_EQ(status, 400) << text;
    const json e = json::parse(text, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << text;
    EXPECT_NE(e["error"]["message"].get<std::string>().find("nests deeper than 128 levels"),
              std::string::npos)
        << text;
  }
  // 127 levels inside the body (128 with it) is within the limit and reaches the handler, whose
  // own check rejects the value.
  const auto [status, text] =
      Post("/v1/completions", R"({"prompt": [1], "logit_bias": )" + nested(127, "[", "]") + "}");
  EXPECT_EQ(status, 400) << text;
  EXPECT_EQ(json::parse(text)["error"]["param"], "logit_bias") << text;
  EXPECT_EQ(Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 1}}.dump()).first,
            200);
}
// A /metrics scrape: each sample line "name{labels} value", keyed by "name{labels}".
std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) << line;
      continue;
    }
    const size_t close = line.rfind('}');
    const size_t space = line.rfind(' ');
    EXPECT_TRUE(close != std::string::npos && line.find('{') != std::string::npos &&
                space == close + 1 && space + 1 < line.size())
        << line;
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space);
    EXPECT_EQ(samples.count(key), 0u) << "duplicate sample " << key;
    EXPECT_NE(key.find("model_name=\"tiny\""), std::string::npos) << line;
    EXPECT_NE(key.find("engine=\"0\""), std::string::npos) << line;
    samples[key] = std::stod(line.substr(space + 1));
  }
  return samples;
}

// The value of metric `name` whose labels contain `label` ("" any), or -1 if none.
double Sample(const std::map<std::string, double>& m, const std::string& name,
              const std::string& label = "") {
  for (const auto& [key, value] : m) {
    if (key.rfind(name + "{", 0) == 0 && key.find(label) != std::string::npos) return value;
  }
  return -1;
}

// Checks every histogram: cumulative buckets never decrease, le="+Inf" equals _count.
void CheckHistograms(const std::map<std::string, double>& m) {
  for (const char* h : {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                        "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"}) {
    const std::string bucket = std::string(h) + "_bucket{";
    std::vector<std::pair<double, double>> buckets;  // (le, count)
    for (const auto& [key, value] : m) {
      if (key.rfind(bucket, 0) != 0) continue;
      const size_t le = key.find("le=\"");
      ASSERT_NE(le, std::string::npos) << key;
      const std::string bound = key.substr(le + 4, key.find('"', le + 4) - le - 4);
      buckets.emplace_back(bound == "+Inf" ? INFINITY : std::stod(bound), value);
    }
    ASSERT_GE(buckets.size(), 2u) << h;
    std::sort(buckets.begin(), buckets.end());
    for (size_t i = 1; i < buckets.size(); ++i)
      EXPECT_LE(buckets[i - 1].second, buckets[i].second) << h;
    EXPECT_EQ(buckets.back().first, INFINITY) << h;
    EXPECT_EQ(buckets.back().second, Sample(m, std::string(h) + "_count")) << h;
    EXPECT_GE(Sample(m, std::string(h) + "_sum"), 0) << h;
  }
}

TEST_F(ServerTest, PrometheusMetrics) {
  // No API key: /metrics is outside /v1, as vLLM's.
  const auto scrape = [] {
    auto r = Client(/*with_key=*/false).Get("/metrics");
    EXPECT_TRUE(r);
    if (!r) return std::map<std::string, double>();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u)
        << r->get_header_value("Content-Type");
    return ParseMetrics(r->body);
  };
  const std::map<std::string, double> before = scrape();
  CheckHistograms(before);

  int64_t prompt_tokens = 0, completion_tokens = 0;
  // Non-stream, hitting max_tokens.
  const json whole =
      PostJson("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}, {"ignore_eos", true}});
  prompt_tokens += whole["usage"]["prompt_tokens"].get<int64_t>();
  completion_tokens += whole["usage"]["completion_tokens"].get<int64_t>();
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  // Stream with usage.
  const auto [status, body] =
      Post("/v1/completions", json{{"prompt", "Once upon a time"},
                                   {"max_tokens", 7},
                                   {"stream", true},
                                   {"stream_options", {{"include_usage", true}}}}
                                  .dump());
  ASSERT_EQ(status, 200) << body;
  const std::vector<std::string> events = SseData(body);
  ASSERT_GE(events.size(), 2u);
  const json usage = json::parse(events[events.size() - 2])["usage"];
  prompt_tokens += usage["prompt_tokens"].get<int64_t>();
  completion_tokens += usage["completion_tokens"].get<int64_t>();
  // A chat.
  const json chat =
      PostJson("/v1/chat/completions",
               {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 4}});
  prompt_tokens += chat["usage"]["prompt_tokens"].get<int64_t>();
  completion_tokens += chat["usage"]["completion_tokens"].get<int64_t>();

  // The loop samples its gauges right after the step that ends the last request; allow it a
  // moment past the response.
  std::map<std::string, double> after = scrape();
  for (int i = 0; i < 50 && Sample(after, "vllm:num_requests_running") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = scrape();
  }
  CheckHistograms(after);
  EXPECT_EQ(Sample(after, "vllm:num_requests_running"), 0);
  EXPECT_EQ(Sample(after, "vllm:num_requests_waiting"), 0);
  EXPECT_EQ(Sample(after, "vllm:kv_cache_usage_perc"), 0);
  const auto delta = [&](const std::string& name, const std::string& label = "") {
    return Sample(after, name, label) - Sample(before, name, label);
  };
  EXPECT_EQ(delta("vllm:prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(delta("vllm:generation_tokens_total"), completion_tokens);
  EXPECT_GE(delta("vllm:request_success_total", "finished_reason=\"length\""), 1);
  double finished = 0;
  for (const char* reason : {"stop", "length", "abort"}) {
    finished += delta("vllm:request_success_total", fmt::format("finished_reason=\"{}\"", reason));
  }
  EXPECT_EQ(finished, 3);
  EXPECT_EQ(delta("vllm:time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(delta("vllm:e2e_request_latency_seconds_count"), 3);
  EXPECT_EQ(delta("vllm:request_queue_time_seconds_count"), 3);
  EXPECT_EQ(delta("vllm:inter_token_latency_seconds_count"), completion_tokens - 3);
  EXPECT_GE(delta("vllm:prefix_cache_queries_total"), 0);
  EXPECT_GE(Sample(after, "vllm:prefix_cache_queries_total"),
            Sample(after, "vllm:prefix_cache_hits_total"));
  EXPECT_GE(Sample(after, "vllm:num_preemptions_total"), 0);
}

TEST_F(ServerTest, ClientDisconnectAbortsTheRequest) {
  httplib::Client c = Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Authorization", std::string("Bearer ") + kApiKey}};
  req.set_header("Content-Type", "application/json");
  req.body =
      json{{"prompt", kPrompt}, {"max_tokens", 240}, {"ignore_eos", true}, {"stream", true}}.dump();
  std::string received;
  // Returning false after the first chunk makes the client give up and close the connection.
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    received.append(data, n);
    return false;
  };
  httplib::Response res;
  httplib::Error error;
  c.send(req, res, error);
  EXPECT_NE(received.find("data: "), std::string::npos);
  // The server notices on its next write and aborts; it stays healthy.
  bool aborted = false;
  for (int i = 0; i < 100 && !aborted; ++i) {
    aborted = e2e::ReadFile(*dir_ / "serve.err").find("client gone") != std::string::npos;
    if (!aborted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(aborted) << e2e::ReadFile(*dir_ / "serve.err");
  auto health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(PostJson("/v1/completions",
                     {{"prompt", kPrompt}, {"max_tokens", 3}})["usage"]["completion_tokens"],
            3);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// The issue's load case: 32 concurrent streams, 8 of which disconnect midway. The other 24 give
// exactly what they give alone; afterwards nothing runs and every KV block is free again.
TEST_F(ServerTest, ThirtyTwoStreamsEightDisconnect) {
  constexpr int kStreams = 32;
  const auto request = [](int i) {
    std::vector<int32_t> prompt = kPrompt;
    prompt[0] = 100 + i;
    prompt.push_back(i);
    const bool quits = i % 4 == 3;  // 8 of 32
    return json{{"prompt", prompt},
                {"max_tokens", quits ? 200 : 12 + i % 5},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", true}};
  };
  const auto text_of = [](const std::string& body) {
    std::string text;
    for (const std::string& e : SseData(body)) {
      if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
    }
    return text;
  };
  std::vector<std::string> alone(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    if (i % 4 == 3) continue;
    const auto [status, body] = Post("/v1/completions", request(i).dump());
    ASSERT_EQ(status, 200) << body;
    alone[i] = text_of(body);
  }

  const auto aborted = [] {
    auto r = Client(false).Get("/metrics");
    return r ? Sample(ParseMetrics(r->body), "vllm:request_success_total",
                      "finished_reason=\"abort\"")
             : -1.0;
  };
  const double aborted_before = aborted();
  std::vector<std::string> together(kStreams);
  std::vector<int> events_seen(kStreams, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      if (i % 4 == 3) {
        // A quitter closes its connection after its third event.
        together[i] = RawStream("/v1/completions", request(i).dump(), 3);
        events_seen[i] = static_cast<int>(SseData(together[i]).size());
        return;
      }
      together[i] = RawStream("/v1/completions", request(i).dump());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    if (i % 4 == 3) {
      EXPECT_GE(events_seen[i], 3) << i;
      EXPECT_EQ(together[i].find("[DONE]"), std::string::npos) << "stream " << i << " completed";
      continue;
    }
    EXPECT_EQ(text_of(together[i]), alone[i]) << "stream " << i << ": " << together[i];
    EXPECT_NE(together[i].find("data: [DONE]"), std::string::npos) << i;
  }

  // The aborts land on the server's next write; poll /metrics until they have.
  std::map<std::string, double> m;
  for (int tries = 0; tries < 100; ++tries) {
    auto r = Client(false).Get("/metrics");
    ASSERT_TRUE(r);
    m = ParseMetrics(r->body);
    if (Sample(m, "vllm:num_requests_running") == 0 && Sample(m, "vllm:kv_cache_usage_perc") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(Sample(m, "vllm:num_requests_running"), 0);
  EXPECT_EQ(Sample(m, "vllm:num_requests_waiting"), 0);
  EXPECT_EQ(Sample(m, "vllm:kv_cache_usage_perc"), 0);
  EXPECT_EQ(aborted() - aborted_before, 8);
  // And it still serves.
  EXPECT_EQ(PostJson("/v1/completions",
                     {{"prompt", kPrompt}, {"max_tokens", 2}})["usage"]["completion_tokens"],
            2);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// vLLM's batch form: a list of prompts, n choices each, choice p * n + j; each prompt's text
// equals the prompt sent alone; usage counts each prompt once.
TEST_F(ServerTest, ListOfPrompts) {
  const std::vector<int32_t> other = {9, 8, 7, 6};
  const json single = {{"max_tokens", 6}, {"temperature", 1.0}, {"ignore_eos", true}};
  json batch = single;
  batch["prompt"] = {kPrompt, other};
  batch["n"] = 2;
  batch["seed"] = 5;
  const json r = PostJson("/v1/completions", batch);
  ASSERT_EQ(r["choices"].size(), 4u) << r.dump();
  // Choice j of a prompt is seeded seed + j.
  const auto alone = [&](const std::vector<int32_t>& prompt, int seed) {
    json one = single;
    one["prompt"] = prompt;
    one["seed"] = seed;
    return PostJson("/v1/completions", one)["choices"][0]["text"].get<std::string>();
  };
  const std::string expected[4] = {alone(kPrompt, 5), alone(kPrompt, 6), alone(other, 5),
                                   alone(other, 6)};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], expected[i]) << i;
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], kPrompt.size() + other.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 4 * 6);
  // Text prompts too, streamed.
  json texts = single;
  texts["temperature"] = 0;
  texts["prompt"] = {"Hello there", "Once upon"};
  texts["stream"] = true;
  const auto [status, body] = Post("/v1/completions", texts.dump());
  ASSERT_EQ(status, 200) << body;
  std::string streamed[2];
  for (const std::string& e : SseData(body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    streamed[c["index"].get<int>()] += c["text"].get<std::string>();
  }
  texts["stream"] = false;
  const json whole = PostJson("/v1/completions", texts);
  EXPECT_EQ(streamed[0], whole["choices"][0]["text"]);
  EXPECT_EQ(streamed[1], whole["choices"][1]["text"]);
}

// prompt_logprobs: vLLM's [null, {"<id>": {logprob, rank, decoded_token}}, ...], equal to
// `generate --prompt-logprobs`'s.
TEST_F(ServerTest, PromptLogprobs) {
  const json r = PostJson("/v1/completions", {{"prompt", kPrompt},
                                              {"max_tokens", 2},
                                              {"temperature", 0},
                                              {"ignore_eos", true},
                                              {"prompt_logprobs", 2}});
  const json lp = r["choices"][0]["prompt_logprobs"];
  ASSERT_TRUE(lp.is_array()) << r.dump();
  ASSERT_EQ(lp.size(), kPrompt.size());
  EXPECT_TRUE(lp[0].is_null());
  const e2e::CommandResult ref = e2e::RunMoeserve(
      fmt::format("generate --model {} --token-ids 5,17,42,99,3,250,7 --max-tokens 2 "
                  "--prompt-logprobs 2 --json",
                  Model()),
      *dir_ / "generate.err");
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const json ref_json = json::parse(ref.out)["requests"][0];
  for (size_t i = 1; i < kPrompt.size(); ++i) {
    const std::string id = std::to_string(kPrompt[i]);
    ASSERT_TRUE(lp[i].contains(id)) << lp[i].dump();
    EXPECT_GE(lp[i].size(), 2u);
    EXPECT_LE(lp[i].size(), 3u);
    const double logprob = lp[i][id]["logprob"];
    EXPECT_LE(logprob, 0.0);
    EXPECT_GE(lp[i][id]["rank"].get<int64_t>(), 1);
    EXPECT_TRUE(lp[i][id]["decoded_token"].is_string());
    EXPECT_NEAR(logprob, ref_json["prompt_logprobs"][i]["logprob"].get<double>(), 1e-5)
        << ref_json["prompt_logprobs"][i].dump();
  }
  // Chat: on the response.
  const json chat =
      PostJson("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                        {"max_tokens", 2},
                                        {"prompt_logprobs", 0}});
  ASSERT_TRUE(chat["prompt_logprobs"].is_array()) << chat.dump();
  EXPECT_EQ(chat["prompt_logprobs"].size(), chat["usage"]["prompt_tokens"].get<size_t>());
}

// echo: the prompt's text before the output, and with logprobs the prompt's tokens first (the
// first without a logprob), in both the response and the stream.
TEST_F(ServerTest, Echo) {
  const json request = {{"prompt", "Hello there"}, {"max_tokens", 4}, {"temperature", 0},
                        {"ignore_eos", true},      {"echo", true},    {"logprobs", 1}};
  const json r = PostJson("/v1/completions", request);
  json plain = request;
  plain.erase("echo");
  const json p = PostJson("/v1/completions", plain);
  EXPECT_EQ(r["choices"][0]["text"], "Hello there" + p["choices"][0]["text"].get<std::string>());
  const json lp = r["choices"][0]["logprobs"];
  const size_t prompt_len = r["usage"]["prompt_tokens"];
  ASSERT_EQ(lp["tokens"].size(), prompt_len + 4) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < prompt_len + 4; ++i) EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lp["token_logprobs"][prompt_len + i],
              p["choices"][0]["logprobs"]["token_logprobs"][i]);
  }
  std::string joined;
  for (const json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, r["choices"][0]["text"]);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_FALSE(r["choices"][0].contains("prompt_logprobs"));  // not asked
  // Streamed: the same text and logprobs.
  json streamed = request;
  streamed["stream"] = true;
  const auto [status, body] = Post("/v1/completions", streamed.dump());
  ASSERT_EQ(status, 200);
  std::string text;
  size_t tokens = 0;
  for (const std::string& e : SseData(body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    text += c["text"].get<std::string>();
    if (c["logprobs"].is_object()) tokens += c["logprobs"]["tokens"].size();
  }
  EXPECT_EQ(text, r["choices"][0]["text"]);
  EXPECT_EQ(tokens, prompt_len + 4);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// vLLM's --generation-config auto: generation_config.json's sampling keys are the defaults under
// each request's own, its extra EOS ids stop generation unless ignore_eos, and its max_new_tokens
// caps max_tokens.
TEST_F(ServerTest, GenerationConfigDefaults) {
  const json greedy = Generate(kPrompt, 6);
  const int32_t first = greedy["token_ids"][0];
  const fs::path model = *dir_ / "with_generation_config";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(Model())) {
    fs::copy(entry.path(), model / entry.path().filename());
  }
  // The first greedy token becomes an extra EOS id.
  e2e::WriteFile(model / "generation_config.json",
                 fmt::format(R"({{"temperature": 0.0, "top_k": 1, "eos_token_id": [{}],
                                  "max_new_tokens": 4}})",
                             first));
  e2e::ServerProcess server({"--model", model.string(), "--max-model-len", "256"},
                            *dir_ / "serve_generation_config.err");
  ASSERT_TRUE(server.ok()) << server.log();
  httplib::Client c("127.0.0.1", server.port());
  const auto complete = [&](json body) {
    body["prompt"] = kPrompt;
    body["max_tokens"] = 6;
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body)["choices"][0] : json();
  };
  // No temperature in the request: the file's 0 makes it greedy; ignore_eos passes the extra EOS;
  // max_tokens 6 is capped to the file's 4.
  const json capped = complete({{"ignore_eos", true}});
  EXPECT_EQ(capped["text"], Generate(kPrompt, 4)["text"]);
  EXPECT_EQ(capped["finish_reason"], "length");
  // Without ignore_eos the extra EOS ends it at once: vLLM's stop, the id as stop_reason, and
  // the stop token's text left out.
  const json stopped = complete(json::object());
  EXPECT_EQ(stopped["finish_reason"], "stop");
  EXPECT_EQ(stopped["stop_reason"], first);
  EXPECT_EQ(stopped["text"], "");
  // A request's own key wins over the file's.
  EXPECT_EQ(
      complete({{"ignore_eos", true}, {"temperature", 1.0}, {"top_k", 0}, {"seed", 1}}).is_object(),
      true);
  EXPECT_NE(server.log().find("generation_config.json: temperature=0"), std::string::npos)
      << server.log();
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// A conversation through /v1/chat/completions on the default model (hybrid; trained, so its
// answers re-render as the tokens it generated): each turn's usage.prompt_tokens_details
// .cached_tokens shows it resumed where the previous answer ended, so it computed only its new
// tokens plus < 64.
TEST_F(ServerTest, FollowUpChatTurnsAreServedFromThePrefixCache) {
  e2e::ServerProcess server({"--served-model-name", "tiny"}, *dir_ / "serve_default_model.err");
  ASSERT_TRUE(server.ok()) << server.log();
  httplib::Client c("127.0.0.1", server.port());
  c.set_read_timeout(120, 0);
  const auto chat = [&](const json& messages, int max_tokens) {
    const json body = {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  json messages = json::array();
  int64_t previous = 0;  // the last turn's prompt + answer tokens
  int64_t all_prompt = 0, all_cached = 0;
  for (const char* text : {"Tell me a story about a cat.", "And then what happened next?",
                           "Why did the cat do that?"}) {
    SCOPED_TRACE(text);
    messages.push_back({{"role", "user"}, {"content", text}});
    const json r = chat(messages, 60);
    ASSERT_TRUE(r.contains("usage")) << r.dump();
    const int64_t prompt = r["usage"]["prompt_tokens"].get<int64_t>();
    const int64_t cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    if (previous == 0) {
      EXPECT_EQ(cached, 0);
    } else {
      EXPECT_GT(cached, 0) << r.dump();
      EXPECT_LE(prompt - cached, prompt - previous + 64) << r.dump();
    }
    previous = prompt + r["usage"]["completion_tokens"].get<int64_t>();
    all_prompt += prompt;
    all_cached += cached;
    messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
  }
  // vLLM's counters count the hybrid model's hits as the usage reported them.
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m && m->status == 200);
  const std::map<std::string, double> metrics = ParseMetrics(m->body);
  EXPECT_EQ(Sample(metrics, "vllm:prefix_cache_queries_total"), all_prompt);
  EXPECT_EQ(Sample(metrics, "vllm:prefix_cache_hits_total"), all_cached);
}

}  // namespace
}  // namespace moeserve
