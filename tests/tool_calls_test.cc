// Tool calls and reasoning through `moeserve serve` on the default model with Qwen3.5's chat
// template (so `auto` picks the qwen3_xml tool-call parser and the qwen3 reasoning parser), and
// with --tool-call-parser hermes: tool_choice "required" and a named function give tool_calls
// whose arguments validate against the tool's schema (Python's jsonschema), streamed deltas
// concatenate to the non-streamed message, thinking is split into `reasoning` (and turned off by
// enable_thinking false or reasoning_effort none), and bad tool requests are 400s.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <map>
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
using nlohmann::ordered_json;

const fs::path kSource = MOESERVE_SOURCE_DIR;

// Parameters the default model (trained on novels) fills in a few tokens: no free text.
const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather",
   "parameters": {"type": "object", "properties": {
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
     "days": {"type": "integer", "minimum": 1, "maximum": 7},
     "hourly": {"type": "boolean"}},
     "required": ["unit", "days"]}}},
  {"type": "function", "function": {"name": "set_alarm",
   "parameters": {"type": "object", "properties": {
     "minutes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 59},
                 "minItems": 1, "maxItems": 3}},
     "required": ["minutes"]}}}
])");

class ToolCallsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("moeserve_tool_calls_test_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
  }
  static void TearDownTestSuite() {
    delete xml_;
    delete hermes_;
    delete qwen3_;
    xml_ = hermes_ = qwen3_ = nullptr;
    fs::remove_all(*dir_);
    delete dir_;
  }

  // The servers, each started by the first test that needs it (ctest runs every test in a
  // process of its own). The default model with Qwen3.5's template: tool calls read by `auto`
  // (qwen3_xml), or as hermes.
  static const e2e::ServerProcess& Xml() { return Started(&xml_, {}, "xml"); }
  static const e2e::ServerProcess& Hermes() {
    return Started(&hermes_, {"--tool-call-parser", "hermes"}, "hermes");
  }
  // A small random model with the real Qwen3 tokenizer and template: <tool_call> and </think>
  // are single tokens there, the triggers of lazy grammars.
  static const e2e::ServerProcess& Qwen3() {
    if (qwen3_ == nullptr) {
      const e2e::CommandResult made = e2e::RunMoeserve(
          fmt::format("make-model --preset qwen3-30b-a3b --num-layers 1 --hidden-size 64 "
                      "--num-experts 4 --experts-per-token 2 --moe-intermediate-size 64 "
                      "--num-heads 2 --num-kv-heads 1 --head-dim 32 --out {}",
                      (*dir_ / "qwen3").string()),
          *dir_ / "make_model.err");
      EXPECT_EQ(made.exit_code, 0) << made.err;
      qwen3_ = new e2e::ServerProcess(
          {"--model", (*dir_ / "qwen3").string(), "--max-model-len", "2048"}, *dir_ / "qwen3.log");
      EXPECT_TRUE(qwen3_->ok()) << qwen3_->log();
    }
    return *qwen3_;
  }
  static const e2e::ServerProcess& Started(e2e::ServerProcess** server,
                                           std::vector<std::string> args, const std::string& name) {
    if (*server == nullptr) {
      args.insert(args.begin(),
                  {"--chat-template",
                   (kSource / "testdata" / "chat-templates" / "qwen3.5.jinja").string()});
      *server = new e2e::ServerProcess(args, *dir_ / (name + ".log"));
      EXPECT_TRUE((*server)->ok()) << (*server)->log();
    }
    return **server;
  }

  static std::pair<int, std::string> Post(const e2e::ServerProcess& s, const ordered_json& body) {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    if (!r) return {-1, httplib::to_string(r.error())};
    return {r->status, r->body};
  }

  static ordered_json Request(ordered_json tool_choice, int seed, bool thinking = false) {
    ordered_json body = {
        {"messages", {{{"role", "user"}, {"content", "What will the weather be?"}}}},
        {"tools", kTools},
        {"tool_choice", std::move(tool_choice)},
        {"temperature", 1.0},
        {"seed", seed},
        {"max_tokens", 120}};
    if (!thinking) body["chat_template_kwargs"] = {{"enable_thinking", false}};
    return body;
  }

  // The message of a non-streamed answer, and the same request streamed, its deltas joined.
  static std::pair<json, json> MessageAndStream(const e2e::ServerProcess& s, ordered_json body) {
    const auto [status, text] = Post(s, body);
    EXPECT_EQ(status, 200) << text;
    const json answer = json::parse(text, nullptr, false);
    body["stream"] = true;
    const auto [stream_status, stream] = Post(s, body);
    EXPECT_EQ(stream_status, 200) << stream;
    json joined = {{"content", ""}, {"reasoning", ""}, {"tool_calls", json::array()}};
    std::string finish;
    for (size_t pos = 0; (pos = stream.find("data: ", pos)) != std::string::npos;) {
      const size_t end = stream.find("\n\n", pos);
      const std::string data = stream.substr(pos + 6, end - pos - 6);
      pos = end;
      if (data == "[DONE]") break;
      const json c = json::parse(data)["choices"][0];
      if (c["finish_reason"].is_string()) finish = c["finish_reason"];
      const json& d = c["delta"];
      if (d.contains("content") && d["content"].is_string())
        joined["content"] = joined["content"].get<std::string>() + d["content"].get<std::string>();
      if (d.contains("reasoning"))
        joined["reasoning"] =
            joined["reasoning"].get<std::string>() + d["reasoning"].get<std::string>();
      for (const json& call : d.value("tool_calls", json::array())) {
        const size_t i = call["index"];
        json& calls = joined["tool_calls"];
        if (i >= calls.size()) {
          calls.push_back(
              {{"id", call["id"]}, {"name", call["function"]["name"]}, {"arguments", ""}});
        }
        calls[i]["arguments"] = calls[i]["arguments"].get<std::string>() +
                                call["function"].value("arguments", std::string());
      }
    }
    joined["finish_reason"] = finish;
    return {answer, joined};
  }

  // Every call names a tool and its arguments validate against that tool's parameters.
  static void ExpectValidCalls(const json& message, const std::string& only = "") {
    ASSERT_TRUE(message["tool_calls"].is_array() && !message["tool_calls"].empty()) << message;
    std::string cases;
    for (const json& call : message["tool_calls"]) {
      const std::string name = call["function"]["name"];
      if (!only.empty()) {
        EXPECT_EQ(name, only);
      }
      const std::string arguments = call["function"]["arguments"];
      json schema;
      for (const ordered_json& t : kTools) {
        if (t["function"]["name"] == name) schema = json::parse(t["function"]["parameters"].dump());
      }
      ASSERT_FALSE(schema.is_null()) << name;
      cases += json{{"kind", "json"}, {"schema", schema}, {"output", arguments}}.dump() + "\n";
    }
    const fs::path file = *dir_ / "calls.jsonl";
    e2e::WriteFile(file, cases);
    const e2e::CommandResult v = e2e::RunShell(
        fmt::format("python3 {} {}", (kSource / "structured" / "testdata" / "validate.py").string(),
                    file.string()),
        *dir_ / "validate.err");
    EXPECT_EQ(v.exit_code, 0) << v.out << message;
  }

  static fs::path* dir_;
  static e2e::ServerProcess* xml_;
  static e2e::ServerProcess* hermes_;
  static e2e::ServerProcess* qwen3_;
};

fs::path* ToolCallsTest::dir_ = nullptr;
e2e::ServerProcess* ToolCallsTest::xml_ = nullptr;
e2e::ServerProcess* ToolCallsTest::hermes_ = nullptr;
e2e::ServerProcess* ToolCallsTest::qwen3_ = nullptr;

// Qwen3's ids of <tool_call> and </think>.
constexpr int kToolCallToken = 151657;
constexpr int kThinkEndToken = 151668;

TEST_F(ToolCallsTest, RequiredAndNamedCallsValidateStreamedOrNot) {
  for (const e2e::ServerProcess* s : {&Xml(), &Hermes()}) {
    for (int seed = 0; seed < 2; ++seed) {
      for (const ordered_json& choice :
           {ordered_json("required"),
            ordered_json{{"type", "function"}, {"function", {{"name", "set_alarm"}}}}}) {
        SCOPED_TRACE(
            fmt::format("{} seed {} {}", s == xml_ ? "qwen3_xml" : "hermes", seed, choice.dump()));
        // One call each (a random walk through parallel calls rarely stops: the next test).
        ordered_json body = Request(choice, seed);
        body["parallel_tool_calls"] = false;
        const auto [answer, streamed] = MessageAndStream(*s, body);
        const json& c = answer["choices"][0];
        ASSERT_EQ(c["finish_reason"], "tool_calls") << answer;
        const json& message = c["message"];
        EXPECT_TRUE(message["content"].is_null()) << message;
        ExpectValidCalls(message, choice.is_object() ? "set_alarm" : "");
        EXPECT_EQ(streamed["finish_reason"], "tool_calls");
        ASSERT_EQ(streamed["tool_calls"].size(), message["tool_calls"].size()) << streamed;
        for (size_t i = 0; i < streamed["tool_calls"].size(); ++i) {
          const json& a = message["tool_calls"][i];
          const json& b = streamed["tool_calls"][i];
          EXPECT_EQ(a["function"]["name"], b["name"]);
          EXPECT_EQ(a["function"]["arguments"], b["arguments"]);
          EXPECT_TRUE(b["id"].is_string() &&
                      b["id"].get<std::string>().rfind("chatcmpl-tool-", 0) == 0);
        }
      }
    }
  }
}

// Parallel calls (the default): calls follow one another until the model stops or max_tokens
// cuts the last one; every complete one validates.
TEST_F(ToolCallsTest, ParallelCallsAreEachWellFormed) {
  const auto [status, text] = Post(Xml(), Request("required", 11));
  ASSERT_EQ(status, 200) << text;
  const json choice = json::parse(text)["choices"][0];
  json message = choice["message"];
  ASSERT_GE(message["tool_calls"].size(), 1u) << message;
  if (choice["finish_reason"] == "length")
    message["tool_calls"].erase(message["tool_calls"].size() - 1);
  if (!message["tool_calls"].empty()) ExpectValidCalls(message);
}

// With thinking on, the default model (no </think> token, never trained to close thinking)
// writes reasoning until max_tokens: all of it is reasoning, none is content; thinking off by
// reasoning_effort none gives content and no reasoning.
TEST_F(ToolCallsTest, ThinkingIsReasoningAndCanBeTurnedOff) {
  ordered_json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                       {"max_tokens", 24},
                       {"temperature", 0}};
  const auto [answer, streamed] = MessageAndStream(Xml(), body);
  const json& message = answer["choices"][0]["message"];
  EXPECT_TRUE(message["reasoning"].is_string() && !message["reasoning"].get<std::string>().empty())
      << message;
  EXPECT_EQ(message["reasoning_content"], message["reasoning"]);
  EXPECT_TRUE(message["content"].is_null() || message["content"] == "") << message;
  EXPECT_EQ(streamed["reasoning"], message["reasoning"]);
  body["reasoning_effort"] = "none";
  const auto [status, text] = Post(Xml(), body);
  ASSERT_EQ(status, 200) << text;
  const json off = json::parse(text)["choices"][0]["message"];
  EXPECT_TRUE(off["reasoning"].is_null()) << off;
  EXPECT_TRUE(off["content"].is_string() && !off["content"].get<std::string>().empty()) << off;
}

// A conversation with an earlier call (arguments as JSON text) and its result renders and runs.
TEST_F(ToolCallsTest, ToolLoopHistoryIsAccepted) {
  ordered_json body = Request("auto", 2);
  body["messages"] = ordered_json::parse(R"([
    {"role": "user", "content": "Weather for three days?"},
    {"role": "assistant", "content": null, "reasoning": "The user wants weather.",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"unit\": \"celsius\", \"days\": 3}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  const auto [status, text] = Post(Xml(), body);
  ASSERT_EQ(status, 200) << text;
  body["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  const auto [bad, bad_text] = Post(Xml(), body);
  EXPECT_EQ(bad, 400) << bad_text;
  EXPECT_NE(bad_text.find("arguments"), std::string::npos) << bad_text;
}

// tool_choice auto with a "strict" tool: text is free, but each call the model opens (pushed
// here by a logit bias on <tool_call>) is held to the tool's schema until it closes; then text is
// free again and the next <tool_call> wakes the grammar anew.
TEST_F(ToolCallsTest, StrictToolsHoldEachCallTheModelOpens) {
  ordered_json tools = kTools;
  for (ordered_json& t : tools) t["function"]["strict"] = true;
  for (int seed = 0; seed < 3; ++seed) {
    ordered_json body = Request("auto", seed);
    body["tools"] = tools;
    body["max_tokens"] = 160;
    body["logit_bias"] = {{std::to_string(kToolCallToken), 30}};
    const auto [status, text] = Post(Qwen3(), body);
    ASSERT_EQ(status, 200) << text;
    const json choice = json::parse(text)["choices"][0];
    json message = choice["message"];
    ASSERT_GE(message["tool_calls"].size(), 1u) << message;
    // max_tokens may cut the last call; every call before it was closed under the grammar.
    const bool last_complete =
        json::accept(message["tool_calls"].back()["function"]["arguments"].get<std::string>());
    if (!last_complete) message["tool_calls"].erase(message["tool_calls"].size() - 1);
    if (!message["tool_calls"].empty()) ExpectValidCalls(message);
  }
}

// Thinking on: the reasoning is free and the required call's grammar starts at </think> (pushed
// by a logit bias), so the answer has reasoning and a valid call.
TEST_F(ToolCallsTest, RequiredCallsWaitForTheEndOfThinking) {
  ordered_json body = Request("required", 5, /*thinking=*/true);
  body["parallel_tool_calls"] = false;
  body["max_tokens"] = 160;
  body["logit_bias"] = {{std::to_string(kThinkEndToken), 8}};
  const auto [status, text] = Post(Qwen3(), body);
  ASSERT_EQ(status, 200) << text;
  const json choice = json::parse(text)["choices"][0];
  ASSERT_EQ(choice["finish_reason"], "tool_calls") << choice;
  ExpectValidCalls(choice["message"]);
}

// The conversation an agent sends (an assistant turn with reasoning and a call whose arguments are
// JSON text, the tool's result, the next question) is the prompt Jinja2 renders from the form
// vLLM hands the template (arguments as an object, reasoning as reasoning_content): the server's
// /tokenize of the chat against Python's Jinja2 (tests/render_chat_jinja2.py) of Qwen3.5's
// template, thinking on and off.
TEST_F(ToolCallsTest, AToolLoopRendersAsJinja2RendersIt) {
  const ordered_json sent = ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather for three days?"},
    {"role": "assistant", "content": "", "reasoning": "The user wants the weather.",
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather",
                     "arguments": "{\"unit\": \"celsius\", \"days\": 3}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "assistant", "content": "Sunny for three days."},
    {"role": "user", "content": "And tomorrow?"}])");
  ordered_json expected_messages = sent;
  expected_messages[2]["reasoning_content"] = "The user wants the weather.";
  // In the client's key order, as vLLM's json.loads keeps it.
  expected_messages[2]["tool_calls"][0]["function"]["arguments"] = {{"unit", "celsius"},
                                                                    {"days", 3}};
  for (const bool thinking : {true, false}) {
    SCOPED_TRACE(thinking ? "thinking" : "no thinking");
    const ordered_json extra = {{"enable_thinking", thinking}};
    const fs::path input = *dir_ / "render.json";
    e2e::WriteFile(input, ordered_json{{"messages", expected_messages},
                                       {"tools", kTools},
                                       {"add_generation_prompt", true},
                                       {"extra", extra}}
                              .dump());
    const e2e::CommandResult rendered = e2e::RunShell(
        fmt::format("python3 {} {} {}", (kSource / "tests" / "render_chat_jinja2.py").string(),
                    (kSource / "testdata" / "chat-templates" / "qwen3.5.jinja").string(),
                    input.string()),
        *dir_ / "render.err");
    ASSERT_EQ(rendered.exit_code, 0) << e2e::ReadFile(*dir_ / "render.err");
    httplib::Client c("127.0.0.1", Xml().port());
    const auto ours = c.Post(
        "/tokenize",
        ordered_json{{"messages", sent}, {"tools", kTools}, {"chat_template_kwargs", extra}}.dump(),
        "application/json");
    const auto reference = c.Post(
        "/tokenize", ordered_json{{"prompt", rendered.out}, {"add_special_tokens", false}}.dump(),
        "application/json");
    ASSERT_TRUE(ours && reference);
    ASSERT_EQ(ours->status, 200) << ours->body;
    ASSERT_EQ(reference->status, 200) << reference->body;
    EXPECT_EQ(json::parse(ours->body)["tokens"], json::parse(reference->body)["tokens"])
        << rendered.out;
  }
}

TEST_F(ToolCallsTest, BadToolRequestsAre400) {
  const std::vector<std::pair<ordered_json, std::string>> cases = {
      {{{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, "nope"},
      {{{"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"tool_choice", "required"}, {"tools", nullptr}}, "tools"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", 3}}}}}}}, "tools"},
      {{{"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
       "structured output"},
      {{{"reasoning_effort", "extreme"}}, "reasoning_effort"},
  };
  for (const auto& [keys, says] : cases) {
    ordered_json body = Request("auto", 1);
    for (const auto& [k, v] : keys.items()) {
      if (v.is_null()) {
        body.erase(k);
      } else {
        body[k] = v;
      }
    }
    const auto [status, text] = Post(Xml(), body);
    EXPECT_EQ(status, 400) << keys.dump() << " " << text;
    EXPECT_NE(text.find(says), std::string::npos) << keys.dump() << " " << text;
  }
}

}  // namespace
}  // namespace moeserve
