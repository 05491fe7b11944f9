// The chat answer's parsers on text (output_parser.h): reasoning (qwen3, deepseek_r1), tool calls
// (hermes, qwen3_xml) with prose, several calls, malformed and truncated calls, tags inside
// strings; XML values converted by schema types as vLLM converts them; the streaming property
// (the deltas of every cut of an answer concatenate to the non-streamed message); the bounds on
// hostile answers; the `auto` choice over the real chat templates, and their Jinja2-rendered
// assistant turns parsed back to the messages they render; the OpenAI JSON shapes.
#include "server/output_parser.h"
#include "core/test_paths.h"

#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace moeserve::server {
namespace {

using nlohmann::json;

// Tools of the tests: get_weather(city: string, days: integer) and a typed one for XML values.
constexpr char kToolsJson[] = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
  {"type": "function", "function": {"name": "typed", "parameters": {"type": "object",
    "properties": {
      "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
      "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
      "ns": {"anyOf": [{"type": "string"}, {"type": "null"}]},
      "ni": {"type": ["integer", "null"]}}}}},
  {"type": "function", "function": {"name": "no_params"}}
])";

std::shared_ptr<const std::vector<ToolSpec>> Tools() {
  static const auto tools = [] {
    Result<std::vector<ToolSpec>> specs = ReadToolSpecs(kToolsJson);
    EXPECT_TRUE(specs.ok()) << specs.status().ToString();
    return std::make_shared<const std::vector<ToolSpec>>(std::move(*specs));
  }();
  return tools;
}

// Ids "call_0", "call_1", ... per parser, so two parsers of one answer agree.
OutputParserOptions Options(ToolCallFormat tools,
                            ReasoningFormat reasoning = ReasoningFormat::kNone,
                            bool thinking = true) {
  OutputParserOptions o;
  o.tool_calls = tools;
  o.reasoning = reasoning;
  o.thinking_enabled = thinking;
  o.tools = Tools();
  o.new_call_id = [n = 0]() mutable { return "call_" + std::to_string(n++); };
  return o;
}

std::string Describe(const ParsedMessage& m) {
  std::string s = "reasoning=" + json(m.reasoning).dump() + " content=" + json(m.content).dump();
  for (const ToolCall& c : m.tool_calls) {
    s += " call{" + c.id + " " + c.name + " " + json(c.arguments).dump() +
         (c.complete ? "" : " incomplete") + "}";
  }
  return s;
}

bool Same(const ParsedMessage& a, const ParsedMessage& b) { return Describe(a) == Describe(b); }

// Streams `text` cut at `cuts` (ascending offsets) and concatenates the deltas as a client does,
// checking the delta rules on the way: a call's first delta has its index (the next one), id
// and name; later ones neither.
ParsedMessage Stream(const OutputParserOptions& options, std::string_view text,
                     const std::vector<size_t>& cuts, std::string* problem) {
  OutputParser parser(options);
  ParsedMessage m;
  auto take = [&](const MessageDelta& d) {
    m.reasoning += d.reasoning;
    m.content += d.content;
    for (const ToolCallDelta& c : d.tool_calls) {
      if (!c.id.empty()) {
        if (c.index != m.tool_calls.size() || c.name.empty()) *problem = "bad first call delta";
        m.tool_calls.push_back({.id = c.id, .name = c.name, .arguments = "", .complete = false});
      } else if (c.index + 1 != m.tool_calls.size() || !c.name.empty()) {
        *problem = "arguments delta not for the open call";
        continue;
      }
      m.tool_calls[c.index].arguments += c.arguments;
    }
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(parser.Feed(text.substr(at, cut - at)));
    at = cut;
  }
  take(parser.Feed(text.substr(at)));
  take(parser.Finish());
  // `complete` is not in the deltas: the parser's own message has it.
  ParsedMessage own = parser.message();
  for (size_t i = 0; i < m.tool_calls.size() && i < own.tool_calls.size(); ++i) {
    m.tool_calls[i].complete = own.tool_calls[i].complete;
  }
  if (!Same(own, m)) *problem = "message() differs from its deltas: " + Describe(own);
  return m;
}

// The streaming property on `text`: every cut into 2 and 3 pieces, byte by byte, and (short
// texts) every cut at all give the non-streamed message.
void ExpectEveryCutSame(const OutputParserOptions& options, std::string_view text) {
  const ParsedMessage whole = ParseOutput(options, text);
  auto check = [&](const std::vector<size_t>& cuts) {
    std::string problem;
    ParsedMessage streamed = Stream(options, text, cuts, &problem);
    if (problem.empty() && Same(streamed, whole)) return true;
    std::string where;
    for (size_t c : cuts) where += std::to_string(c) + " ";
    ADD_FAILURE() << "text " << json(std::string(text)).dump() << " cut at " << where << "\n"
                  << problem << "\n  streamed: " << Describe(streamed)
                  << "\n  whole:    " << Describe(whole);
    return false;
  };
  const size_t n = text.size();
  std::vector<size_t> bytes;
  for (size_t i = 1; i < n; ++i) bytes.push_back(i);
  if (!check(bytes)) return;
  if (n <= 14) {
    for (uint32_t mask = 0; mask < (1u << (n > 0 ? n - 1 : 0)); ++mask) {
      std::vector<size_t> cuts;
      for (size_t i = 1; i < n; ++i) {
        if (mask & (1u << (i - 1))) cuts.push_back(i);
      }
      if (!check(cuts)) return;
    }
    return;
  }
  for (size_t i = 1; i < n; ++i) {
    for (size_t j = i; j < n; ++j) {
      if (!check({i, j})) return;
    }
  }
}

ParsedMessage Parse(const OutputParserOptions& options, std::string_view text) {
  ExpectEveryCutSame(options, text);
  return ParseOutput(options, text);
}

ToolCall Call(std::string id, std::string name, std::string arguments, bool complete = true) {
  return {.id = std::move(id),
          .name = std::move(name),
          .arguments = std::move(arguments),
          .complete = complete};
}

ParsedMessage Message(std::string reasoning, std::string content,
                      std::vector<ToolCall> calls = {}) {
  return {.reasoning = std::move(reasoning),
          .content = std::move(content),
          .tool_calls = std::move(calls)};
}

#define EXPECT_MESSAGE(actual, expected) EXPECT_EQ(Describe(actual), Describe(expected))

// ---- hermes ----

TEST(HermesToolCalls, PlainTextIsContent) {
  auto o = Options(ToolCallFormat::kHermes);
  EXPECT_MESSAGE(Parse(o, "Hello, world.\n"), Message("", "Hello, world.\n"));
  EXPECT_MESSAGE(Parse(o, "a < b and <tool_callx> </tool_call>"),
                 Message("", "a < b and <tool_callx> </tool_call>"));
  EXPECT_MESSAGE(Parse(o, ""), Message("", ""));
}

TEST(HermesToolCalls, OneCall) {
  auto o = Options(ToolCallFormat::kHermes);
  ParsedMessage m =
      Parse(o,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call>");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", R"({"city": "Paris"})")}));
  json msg = json::parse(ChatMessageJson(m).dump());
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_STREQ(ChatFinishReason(m, "stop"), "tool_calls");
}

TEST(HermesToolCalls, SeveralCallsAfterProse) {
  auto o = Options(ToolCallFormat::kHermes);
  ParsedMessage m =
      Parse(o,
            "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", "
            "\"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"
            "\n</tool_call>");
  EXPECT_MESSAGE(m, Message("", "Let me check both.",
                            {Call("call_0", "get_weather", R"({"city": "Paris", "days": 3})"),
                             Call("call_1", "get_weather", R"({"city":"Oslo"})")}));
}

TEST(HermesToolCalls, TextBetweenAndAfterCallsIsContent) {
  auto o = Options(ToolCallFormat::kHermes);
  ParsedMessage m = Parse(o,
                          "A <tool_call>{\"name\": \"no_params\", \"arguments\": {}}</tool_call> "
                          "then B\n<tool_call>{\"name\": \"no_params\", \"arguments\": {}}"
                          "</tool_call>\n");
  EXPECT_MESSAGE(m,
                 Message("", "A then B",
                         {Call("call_0", "no_params", "{}"), Call("call_1", "no_params", "{}")}));
}

TEST(HermesToolCalls, TagsAndEscapesInsideStrings) {
  auto o = Options(ToolCallFormat::kHermes);
  const std::string args = R"({"city": "</tool_call> <tool_call> \"q\" \\ \u00e9 é", )"
                           R"("x": [1, -2.5e3, 0, true, null, {"y": [[]]}]})";
  ParsedMessage m =
      Parse(o, "<tool_call>{\"name\": \"get_weather\", \"arguments\": " + args + "}</tool_call>");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", args)}));
  EXPECT_NO_THROW(json::parse(m.tool_calls[0].arguments));
}

TEST(HermesToolCalls, MalformedHeadersAreContent) {
  auto o = Options(ToolCallFormat::kHermes);
  for (std::string text : {
           "<tool_call>\nnot json\n</tool_call>",
           "<tool_call>{\"name\": \"unknown_tool\", \"arguments\": {}}</tool_call>",  // not a tool
           "<tool_call>{\"arguments\": {}, \"name\": \"get_weather\"}</tool_call>",   // order
           "<tool_call>{\"name\": \"get_weather\"}</tool_call>",  // no arguments
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{}\"}</tool_call>",  // a string
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": [1]}</tool_call>",
           "<tool_call>{\"name\": \"get_\\weather\", \"arguments\": {}}</tool_call>",  // bad escape
           "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>",
       }) {
    SCOPED_TRACE(text);
    EXPECT_MESSAGE(Parse(o, text), Message("", text));
  }
  // A failed header is content and the next `<tool_call>` is read as a call.
  ParsedMessage m = Parse(o, "<tool_call><tool_call>{\"name\": \"no_params\", \"arguments\": {}}");
  EXPECT_MESSAGE(m, Message("", "<tool_call>", {Call("call_0", "no_params", "{}")}));
}

TEST(HermesToolCalls, TruncatedCalls) {
  auto o = Options(ToolCallFormat::kHermes);
  // Inside the header: content, as the text was.
  EXPECT_MESSAGE(Parse(o, "Sure.\n<tool_call>\n{\"name\": \"get_we"),
                 Message("", "Sure.\n<tool_call>\n{\"name\": \"get_we"));
  EXPECT_MESSAGE(Parse(o, "Sure. <tool_ca"), Message("", "Sure. <tool_ca"));
  // Inside the arguments: the call stays, incomplete, with what was written; finish_reason keeps
  // the engine's "length".
  ParsedMessage m =
      Parse(o, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", R"({"city": "Par)", false)}));
  EXPECT_STREQ(ChatFinishReason(m, "length"), "length");
  // Arguments whole, no closing tags: complete (vLLM also takes valid JSON without the tag).
  m = Parse(o, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 1}");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", R"({"days": 1})")}));
}

TEST(HermesToolCalls, MalformedArgumentsBreakTheCallOnly) {
  auto o = Options(ToolCallFormat::kHermes);
  ParsedMessage m = Parse(o,
                          "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}"
                          "</tool_call>\nDone.");
  EXPECT_MESSAGE(m, Message("", "Done.", {Call("call_0", "get_weather", R"({"city": )", false)}));
  EXPECT_STREQ(ChatFinishReason(m, "stop"), "stop");
  // Every way JSON can go wrong byte-wise, then the closing tag: the call stops at the bad byte.
  // Numbers a double cannot hold, and longer than 64 bytes, are refused too.
  for (std::string bad : std::vector<std::string>{
           R"({"a": 01})", R"({"a": 1.})", R"({"a": -})", R"({"a": tru})", R"({"a" 1})",
           R"({"a": 1,})", R"({,})", R"({"a": "\x"})", "{\"a\": \"\x01\"}", R"({"a": [1 2]})",
           R"({"a": 1])", R"({"a": 1e})", R"({"a": 1e999})", R"({"a": [-1e400]})",
           "{\"a\": 1" + std::string(70, '0') + "}"}) {
    SCOPED_TRACE(bad);
    m = Parse(o, "<tool_call>{\"name\": \"typed\", \"arguments\": " + bad + "}</tool_call>ok");
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_FALSE(m.tool_calls[0].complete);
    EXPECT_EQ(m.content, "ok");
    EXPECT_FALSE(json::accept(m.tool_calls[0].arguments));
  }
}

TEST(HermesToolCalls, ForgottenClosingTag) {
  auto o = Options(ToolCallFormat::kHermes);
  ParsedMessage m = Parse(o,
                          "<tool_call>{\"name\": \"no_params\", \"arguments\": {}}\n"
                          "<tool_call>{\"name\": \"no_params\", \"arguments\": {\"k\": 1}}");
  EXPECT_MESSAGE(
      m, Message("", "",
                 {Call("call_0", "no_params", "{}"), Call("call_1", "no_params", R"({"k": 1})")}));
}

TEST(HermesToolCalls, AnyNameWithoutTools) {
  OutputParserOptions o = Options(ToolCallFormat::kHermes);
  o.tools = nullptr;
  EXPECT_MESSAGE(Parse(o, "<tool_call>{\"name\": \"x\\u0041\", \"arguments\": {}}</tool_call>"),
                 Message("", "", {Call("call_0", "xA", "{}")}));
}

// ---- qwen3_xml ----

TEST(XmlToolCalls, OneCall) {
  auto o = Options(ToolCallFormat::kQwen3Xml);
  ParsedMessage m = Parse(o,
                          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                          "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                          "</tool_call>");
  EXPECT_MESSAGE(
      m, Message("", "", {Call("call_0", "get_weather", R"({"city": "Paris", "days": 3})")}));
  EXPECT_STREQ(ChatFinishReason(m, "stop"), "tool_calls");
}

TEST(XmlToolCalls, SeveralCallsAfterProseAndEmptyArguments) {
  auto o = Options(ToolCallFormat::kQwen3Xml);
  ParsedMessage m =
      Parse(o,
            "I'll look.\n<tool_call>\n<function=no_params>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
            "</parameter>\n</function>\n</tool_call>");
  EXPECT_MESSAGE(m, Message("", "I'll look.",
                            {Call("call_0", "no_params", "{}"),
                             Call("call_1", "get_weather", R"({"city": "Rome"})")}));
}

TEST(XmlToolCalls, StringValuesKeepTheirText) {
  auto o = Options(ToolCallFormat::kQwen3Xml);
  // Newlines inside, quotes, backslashes, tags that are not `</parameter>`, a partial one, and a
  // value's one leading and one trailing newline removed (vLLM's strip).
  const std::string value = "line 1\n  \"q\" \\ <b>x</b> </param </parameterx\n\tend\n";
  ParsedMessage m = Parse(o, "<tool_call>\n<function=typed>\n<parameter=s>\n" + value +
                                 "\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_TRUE(m.tool_calls[0].complete);
  EXPECT_EQ(json::parse(m.tool_calls[0].arguments), json({{"s", value}}));
}

TEST(XmlToolCalls, ValuesConvertedBySchemaType) {
  auto o = Options(ToolCallFormat::kQwen3Xml);
  auto args = [&](const std::string& param, const std::string& value) {
    ParsedMessage m = Parse(o, "<tool_call>\n<function=typed>\n<parameter=" + param + ">\n" +
                                   value + "\n</parameter>\n</function>\n</tool_call>");
    EXPECT_EQ(m.tool_calls.size(), 1u);
    return m.tool_calls.empty() ? json() : json::parse(m.tool_calls[0].arguments).at(param);
  };
  EXPECT_EQ(args("i", "42"), json(42));
  EXPECT_EQ(args("i", "-7"), json(-7));
  EXPECT_EQ(args("i", "4.5"), json("4.5"));  // not an integer: stays a string (vLLM)
  EXPECT_EQ(args("i", "null"), json(nullptr));
  EXPECT_EQ(args("n", "2.5"), json(2.5));
  EXPECT_EQ(args("n", "4.0"), json(4));  // integral: printed as an integer (vLLM)
  EXPECT_EQ(args("n", "1e3"), json(1000));
  EXPECT_EQ(args("n", "abc"), json("abc"));
  EXPECT_EQ(args("n", "inf"), json("inf"));  // not JSON: stays a string
  EXPECT_EQ(args("b", "True"), json(true));
  EXPECT_EQ(args("b", "yes"), json(false));  // vLLM: anything but "true" is false
  EXPECT_EQ(args("o", R"({"k": [1, 2]})"), json({{"k", {1, 2}}}));
  EXPECT_EQ(args("o", "{'k': 1}"), json("{'k': 1}"));  // Python literals: not read (documented)
  EXPECT_EQ(args("a", "[1, \"x\"]"), json({1, "x"}));
  EXPECT_EQ(args("s", "null"), json("null"));    // a string stays a string
  EXPECT_EQ(args("ns", "None"), json(nullptr));  // a nullable one: null
  EXPECT_EQ(args("ns", "text"), json("text"));
  EXPECT_EQ(args("ni", "5"), json(5));  // ["integer", "null"]
  EXPECT_EQ(args("ni", "NULL"), json(nullptr));
  EXPECT_EQ(args("unknown", "5"), json("5"));  // not in the schema: a string
}

TEST(XmlToolCalls, ConvertXmlParamValue) {
  ToolParam integer{.type = "integer", .allows_null = false};
  ToolParam object{.type = "object", .allows_null = false};
  EXPECT_EQ(ConvertXmlParamValue(" 12 ", &integer, 8), "12");
  EXPECT_EQ(ConvertXmlParamValue("+12", &integer, 8), "12");
  EXPECT_EQ(ConvertXmlParamValue("99999999999999999999", &integer, 8), "\"99999999999999999999\"");
  EXPECT_EQ(ConvertXmlParamValue("[[[[1]]]]", &object, 8), "[[[[1]]]]");
  // As Python's json.dumps writes what json.loads read: separators, key order, escapes, UTF-8.
  EXPECT_EQ(ConvertXmlParamValue(R"({"z":1,"a":[true,null,2.5,"\u00e9\n"],"m":{}})", &object, 8),
            "{\"z\": 1, \"a\": [true, null, 2.5, \"\u00e9\\n\"], \"m\": {}}");
  EXPECT_EQ(ConvertXmlParamValue("[[[[1]]]]", &object, 3), "\"[[[[1]]]]\"");  // too deep: text
  EXPECT_EQ(ConvertXmlParamValue("a\"\n\x01", nullptr, 8), "\"a\\\"\\n\\u0001\"");
}

TEST(XmlToolCalls, RepeatedParameterFirstWins) {
  auto o = Options(ToolCallFormat::kQwen3Xml);
  ParsedMessage m = Parse(o,
                          "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n"
                          "<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", R"({"city": "A"})")}));
}

TEST(XmlToolCalls, MalformedAndTruncated) {
  auto o = Options(ToolCallFormat::kQwen3Xml);
  for (std::string text : {
           "<tool_call>\n<function=nope>\n</function>\n</tool_call>",        // not a tool
           "<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>",  // template echo
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",  // hermes
           "<tool_call>\n<function=get_wea",
       }) {
    SCOPED_TRACE(text);
    EXPECT_MESSAGE(Parse(o, text), Message("", text));
  }
  // Cut inside a value: the call stays, incomplete.
  ParsedMessage m = Parse(o, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", R"({"city": "Par)", false)}));
  // A typed value is written when its `</parameter>` comes: cut before, only the key is there.
  m = Parse(o, "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</para");
  EXPECT_MESSAGE(m, Message("", "", {Call("call_0", "get_weather", R"({"days": )", false)}));
  // `</function>` forgotten: `</tool_call>` ends the call.
  m = Parse(o,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n"
            "</tool_call> after");
  EXPECT_MESSAGE(m, Message("", "after", {Call("call_0", "get_weather", R"({"city": "X"})")}));
  // Stray text in the body breaks the call; parsing goes on after `</tool_call>`.
  m = Parse(o, "<tool_call>\n<function=get_weather>\nstray\n</function>\n</tool_call>tail");
  EXPECT_MESSAGE(m, Message("", "tail", {Call("call_0", "get_weather", "{", false)}));
}

// ---- reasoning ----

TEST(Reasoning, Qwen3Split) {
  auto o = Options(ToolCallFormat::kNone, ReasoningFormat::kQwen3);
  EXPECT_MESSAGE(Parse(o, "<think>\nHmm.\n</think>\n\nHello"), Message("\nHmm.\n", "\n\nHello"));
  EXPECT_MESSAGE(Parse(o, "  <think>x</think>y"), Message("x", "y"));
  // Qwen3.5: `<think>` is in the prompt, the answer starts inside thinking.
  EXPECT_MESSAGE(Parse(o, "Hmm.\n</think>\n\nHello"), Message("Hmm.\n", "\n\nHello"));
  // Truncated inside thinking: all reasoning, a partial tag too.
  EXPECT_MESSAGE(Parse(o, "Hmm, let me</thi"), Message("Hmm, let me</thi", ""));
  EXPECT_MESSAGE(Parse(o, "<think"), Message("<think", ""));
  // Only the first `</think>` splits; `<think>` later is text.
  EXPECT_MESSAGE(Parse(o, "a<think>b</think>c</think>d"), Message("a<think>b", "c</think>d"));
  EXPECT_MESSAGE(Parse(o, ""), Message("", ""));
}

TEST(Reasoning, ThinkingDisabledDoesNotSplit) {
  auto o = Options(ToolCallFormat::kNone, ReasoningFormat::kQwen3, /*thinking=*/false);
  EXPECT_MESSAGE(Parse(o, "Hello</think>x"), Message("", "Hello</think>x"));
  EXPECT_TRUE(PromptClosesThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptClosesThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptClosesThinking("<|im_start|>assistant\n"));
}

TEST(Reasoning, DeepSeekR1) {
  auto o = Options(ToolCallFormat::kQwen3Xml, ReasoningFormat::kDeepSeekR1, /*thinking=*/false);
  EXPECT_MESSAGE(Parse(o, "<think>a</think>b"), Message("a", "b"));  // always thinking
  EXPECT_MESSAGE(Parse(o, "a"), Message("a", ""));
  // No tool-call ending of reasoning.
  EXPECT_MESSAGE(Parse(o, "a<tool_call>\n<function=no_params>\n</function>\n</tool_call>"),
                 Message("a<tool_call>\n<function=no_params>\n</function>\n</tool_call>", ""));
}

TEST(Reasoning, WithHermesCalls) {
  auto o = Options(ToolCallFormat::kHermes, ReasoningFormat::kQwen3);
  ParsedMessage m = Parse(o,
                          "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": "
                          "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_MESSAGE(m, Message("\nI need the weather.\n", "",
                            {Call("call_0", "get_weather", R"({"city": "Paris"})")}));
  // A hermes `<tool_call>` inside thinking is reasoning (vLLM's qwen3 parser ends reasoning only
  // at `<tool_call>` then `<function`).
  m = Parse(o, "x <tool_call>{\"name\": \"no_params\", \"arguments\": {}}</tool_call>");
  EXPECT_MESSAGE(
      m, Message("x <tool_call>{\"name\": \"no_params\", \"arguments\": {}}</tool_call>", ""));
}

TEST(Reasoning, XmlCallInsideThinkingEndsIt) {
  auto o = Options(ToolCallFormat::kQwen3Xml, ReasoningFormat::kQwen3);
  ParsedMessage m = Parse(o,
                          "Let me call it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                          "Oslo\n</parameter>\n</function>\n</tool_call>");
  EXPECT_MESSAGE(
      m, Message("Let me call it.\n", "", {Call("call_0", "get_weather", R"({"city": "Oslo"})")}));
  // `<tool_call>` without `<function` after it is reasoning text.
  EXPECT_MESSAGE(Parse(o, "use <tool_call> tags\n</think>ok"),
                 Message("use <tool_call> tags\n", "ok"));
  EXPECT_MESSAGE(Parse(o, "x<tool_call>\n<func"), Message("x<tool_call>\n<func", ""));
  EXPECT_MESSAGE(Parse(o, "x<tool_call>\n<function"), Message("x<tool_call>\n<function", ""));
  EXPECT_MESSAGE(Parse(o, "x<tool_call>\n<functions"), Message("x<tool_call>\n<functions", ""));
  EXPECT_MESSAGE(Parse(o, "x<tool_call><tool_call>\n<function=no_params></function>"),
                 Message("x<tool_call>", "", {Call("call_0", "no_params", "{}")}));
}

// ---- the streaming property on random answers ----

TEST(Streaming, RandomAnswersEveryCut) {
  // Answers assembled from the pieces the parsers look for, and pieces that almost are.
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "<tool_call>\n",
                                           "{\"name\": \"get_weather\", ",
                                           "\"arguments\": ",
                                           "{\"city\": \"P\"}",
                                           "{\"days\": [1, 2.5e1, true]}",
                                           "}",
                                           "{",
                                           "\"",
                                           "<function=get_weather>",
                                           "<function=typed>",
                                           "<parameter=city>",
                                           "<parameter=i>",
                                           "<parameter=n>",
                                           "</parameter>",
                                           "</function>",
                                           "\n",
                                           "  ",
                                           "x",
                                           "<",
                                           "</",
                                           "<think>",
                                           "</think>",
                                           "<tool",
                                           "<function",
                                           "7",
                                           "null",
                                           "\\"};
  std::mt19937 rng(7);
  const std::vector<OutputParserOptions> options = {
      Options(ToolCallFormat::kHermes, ReasoningFormat::kQwen3),
      Options(ToolCallFormat::kQwen3Xml, ReasoningFormat::kQwen3),
      Options(ToolCallFormat::kHermes, ReasoningFormat::kNone),
      Options(ToolCallFormat::kQwen3Xml, ReasoningFormat::kDeepSeekR1)};
  for (int answer = 0; answer < 300; ++answer) {
    std::string text;
    const int n = 3 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    for (const OutputParserOptions& o : options) {
      const ParsedMessage whole = ParseOutput(o, text);
      // Every cut into two pieces and byte by byte.
      std::vector<std::vector<size_t>> cuts;
      std::vector<size_t> bytes;
      for (size_t i = 1; i < text.size(); ++i) {
        cuts.push_back({i});
        bytes.push_back(i);
      }
      cuts.push_back(bytes);
      for (const std::vector<size_t>& c : cuts) {
        std::string problem;
        ParsedMessage streamed = Stream(o, text, c, &problem);
        ASSERT_TRUE(problem.empty() && Same(streamed, whole))
            << json(text).dump() << " cut " << (c.size() == 1 ? c[0] : 0) << ": " << problem
            << "\n  streamed " << Describe(streamed) << "\n  whole    " << Describe(whole);
      }
      // Nothing is invented outside calls, and a complete call's arguments are a JSON object.
      EXPECT_LE(whole.reasoning.size() + whole.content.size(), text.size());
      for (const ToolCall& call : whole.tool_calls) {
        if (!call.complete) continue;
        EXPECT_TRUE(json::accept(call.arguments)) << json(text).dump() << " " << call.arguments;
        EXPECT_EQ(call.arguments.front(), '{');
      }
    }
  }
}

// The golden answers above, each also under every cut, with a reasoning prefix added.
TEST(Streaming, GoldenAnswersWithReasoningPrefix) {
  auto o = Options(ToolCallFormat::kQwen3Xml, ReasoningFormat::kQwen3);
  ExpectEveryCutSame(
      o,
      "<think>\nplan\n</think>\n\nText <tool_call>\n<function=typed>\n<parameter=s>\n"
      "a\nb\n</parameter>\n<parameter=i>\n5\n</parameter>\n</function>\n</tool_call>");
  auto h = Options(ToolCallFormat::kHermes, ReasoningFormat::kQwen3);
  ExpectEveryCutSame(h,
                     "plan</think>Text\n<tool_call>\n{\"name\": \"typed\", \"arguments\": "
                     "{\"o\": {\"k\": \"</tool_call>\"}}}\n</tool_call>");
}

// ---- bounds ----

TEST(Bounds, CallsPastTheLimitAreContent) {
  OutputParserOptions o = Options(ToolCallFormat::kHermes);
  o.limits.max_calls = 2;
  const std::string call = "<tool_call>{\"name\": \"no_params\", \"arguments\": {}}</tool_call>";
  ParsedMessage m = Parse(o, call + call + call);
  EXPECT_EQ(m.tool_calls.size(), 2u);
  EXPECT_EQ(m.content, call);
}

TEST(Bounds, DeepOrLongArgumentsBreakTheCall) {
  OutputParserOptions o = Options(ToolCallFormat::kHermes);
  std::string deep = "{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}";
  ParsedMessage m =
      ParseOutput(o, "<tool_call>{\"name\": \"typed\", \"arguments\": " + deep + "}</tool_call>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_FALSE(m.tool_calls[0].complete);
  EXPECT_EQ(m.tool_calls[0].arguments.size(), 6u + 63u);  // `{"a": ` and 63 more levels

  o.limits.max_argument_bytes = 1000;
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kQwen3Xml}) {
    o.tool_calls = format;
    std::string big(5000, 'x');
    std::string text = format == ToolCallFormat::kHermes
                           ? "<tool_call>{\"name\": \"typed\", \"arguments\": {\"s\": \"" + big +
                                 "\"}}</tool_call>after"
                           : "<tool_call><function=typed><parameter=s>" + big +
                                 "</parameter></function></tool_call>after";
    m = ParseOutput(o, text);
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_FALSE(m.tool_calls[0].complete);
    EXPECT_LE(m.tool_calls[0].arguments.size(), 1000u);
    EXPECT_EQ(m.content, "after");
  }
}

TEST(Bounds, LongNamesAndHeadersAreContent) {
  auto o = Options(ToolCallFormat::kHermes);
  std::string text =
      "<tool_call>{\"name\": \"" + std::string(10000, 'n') + "\", \"arguments\": {}}";
  EXPECT_MESSAGE(ParseOutput(o, text), Message("", text));
  text = "<tool_call>" + std::string(10000, ' ') + "{}";
  EXPECT_MESSAGE(ParseOutput(o, text), Message("", text));
  auto x = Options(ToolCallFormat::kQwen3Xml);
  text = "<tool_call><function=" + std::string(10000, 'n') + ">";
  EXPECT_MESSAGE(ParseOutput(x, text), Message("", text));
}

// Hostile answers of megabytes, fed byte by byte and whole: each byte costs O(1) (a quadratic
// parser would not finish), and nothing grows past the input.
TEST(Bounds, HostileAnswersStayLinear) {
  const size_t n = 2 << 20;
  std::vector<std::string> answers;
  answers.push_back(std::string(n, '<'));
  std::string repeated;
  while (repeated.size() < n) repeated += "<tool_call>";
  answers.push_back(repeated);
  answers.push_back("<tool_call>" + std::string(n, ' ') + "x");
  answers.push_back("<tool_call>\n" + std::string(n, '\n') + "<functio");
  answers.push_back(std::string(n, ' ') + "<tool_ca");
  std::string calls;
  while (calls.size() < n) calls += "<tool_call><function=typed><parameter=s></parameter";
  answers.push_back(calls);
  std::string values = "<tool_call><function=typed><parameter=s>";
  while (values.size() < n) values += "</paramete";
  answers.push_back(values);
  std::string nested = "<tool_call>{\"name\": \"typed\", \"arguments\": {\"a\": ";
  nested += std::string(n, '[');
  answers.push_back(nested);
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kQwen3Xml}) {
    auto o = Options(format, ReasoningFormat::kQwen3);
    for (const std::string& text : answers) {
      ParsedMessage whole = ParseOutput(o, text);
      OutputParser bytes(o);
      size_t out = 0;
      for (char c : text) {
        MessageDelta d = bytes.Feed(std::string_view(&c, 1));
        out += d.reasoning.size() + d.content.size();
      }
      MessageDelta d = bytes.Finish();
      out += d.reasoning.size() + d.content.size();
      EXPECT_TRUE(Same(bytes.message(), whole));
      EXPECT_LE(out, text.size());
      EXPECT_LE(whole.tool_calls.size(), o.limits.max_calls);
    }
  }
}

// ---- auto choice over the real templates ----

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TemplateOfConfig(const std::string& path) {
  return json::parse(ReadText(path)).at("chat_template").get<std::string>();
}

TEST(ChooseParsers, RealTemplates) {
  const std::string data = MOESERVE_TESTDATA_DIR;
  struct Case {
    std::string name, chat_template;
    ToolCallFormat tools;
    ReasoningFormat reasoning;
  };
  const std::vector<Case> cases = {
      {"qwen3.5", ReadText(data + "/chat-templates/qwen3.5.jinja"), ToolCallFormat::kQwen3Xml,
       ReasoningFormat::kQwen3},
      {"qwen3-coder", ReadText(data + "/chat-templates/qwen3-coder.jinja"),
       ToolCallFormat::kQwen3Xml, ReasoningFormat::kNone},
      {"qwen3", TemplateOfConfig(data + "/qwen3-tokenizer/tokenizer_config.json"),
       ToolCallFormat::kHermes, ReasoningFormat::kQwen3},
      {"qwen3-next thinking",
       ReadText(data + "/qwen3-tokenizer/chat_template_qwen3_next_thinking.jinja"),
       ToolCallFormat::kHermes, ReasoningFormat::kQwen3},
      {"default model",
       TemplateOfConfig(std::string(MOESERVE_DEFAULT_MODEL_DIR) + "/tokenizer_config.json"),
       ToolCallFormat::kNone, ReasoningFormat::kNone},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_GT(c.chat_template.size(), 50u);
    ParserChoice choice = ChooseParsers(c.chat_template);
    EXPECT_STREQ(ToolCallFormatName(choice.tool_calls), ToolCallFormatName(c.tools));
    EXPECT_STREQ(ReasoningFormatName(choice.reasoning), ReasoningFormatName(c.reasoning));
  }
}

TEST(ChooseParsers, Names) {
  EXPECT_EQ(*ParseToolCallFormat("qwen3_coder"), ToolCallFormat::kQwen3Xml);
  EXPECT_EQ(*ParseToolCallFormat("qwen3_xml"), ToolCallFormat::kQwen3Xml);
  EXPECT_EQ(*ParseToolCallFormat("hermes"), ToolCallFormat::kHermes);
  EXPECT_FALSE(ParseToolCallFormat("mistral").ok());
  EXPECT_EQ(*ParseReasoningFormat("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_NE(ParseReasoningFormat("r2").status().ToString().find("qwen3"), std::string::npos);
}

// The real formats: every assistant turn of the Jinja2 goldens (Hugging Face's rendering of the
// Qwen3, Qwen3-Next and Qwen3.5 templates, testdata/) -- the text a model trained on the template
// writes -- parsed back with the parsers `auto` picks: the calls, their arguments and the content
// are the turn's own.
std::string Trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

TEST(RealTemplates, RenderedAssistantTurnsParseBack) {
  const std::string data = MOESERVE_TESTDATA_DIR;
  struct Golden {
    std::string cases, chat_template;
  };
  const std::vector<Golden> goldens = {
      {data + "/chat-templates/qwen3.5_cases.jsonl",
       ReadText(data + "/chat-templates/qwen3.5.jinja")},
      {data + "/qwen3-tokenizer/chat_cases.jsonl",
       TemplateOfConfig(data + "/qwen3-tokenizer/tokenizer_config.json")},
      {data + "/qwen3-tokenizer/chat_cases_qwen3_next_thinking.jsonl",
       ReadText(data + "/qwen3-tokenizer/chat_template_qwen3_next_thinking.jinja")},
  };
  constexpr std::string_view kTurn = "<|im_start|>assistant\n";
  int turns = 0, calls = 0;
  for (const Golden& g : goldens) {
    const ParserChoice choice = ChooseParsers(g.chat_template);
    std::ifstream in(g.cases);
    ASSERT_TRUE(in.good()) << g.cases;
    std::string line;
    while (std::getline(in, line)) {
      const json c = json::parse(line);
      SCOPED_TRACE(g.cases + " " + c.at("id").get<std::string>());
      const std::string rendered = c.at("rendered").get<std::string>();
      auto tools = std::make_shared<const std::vector<ToolSpec>>(
          c.contains("tools") ? *ReadToolSpecs(c["tools"].dump()) : std::vector<ToolSpec>{});
      size_t at = 0;
      for (const json& m : c.at("messages")) {
        if (m.at("role") != "assistant") continue;
        // The k-th assistant message is the k-th assistant turn of the rendering.
        at = rendered.find(kTurn, at);
        ASSERT_NE(at, std::string::npos);
        at += kTurn.size();
        const size_t end = rendered.find("<|im_end|>", at);
        if (end == std::string::npos) break;  // the last message, left open
        const std::string turn = rendered.substr(at, end - at);
        SCOPED_TRACE(turn);
        OutputParserOptions o = Options(choice.tool_calls, choice.reasoning,
                                        turn.find("</think>") != std::string::npos);
        o.tools = tools;
        const ParsedMessage parsed = Parse(o, turn);
        ++turns;

        std::string content = m.value("content", "");
        std::string reasoning = m.value("reasoning_content", "");
        if (size_t think_end = content.rfind("</think>"); think_end != std::string::npos) {
          size_t think = content.find("<think>");
          if (think != std::string::npos && reasoning.empty()) {
            reasoning = content.substr(think + 7, think_end - think - 7);
          }
          content = content.substr(think_end + 8);
        }
        EXPECT_EQ(Trimmed(parsed.content), Trimmed(content));
        // A history turn's reasoning may be left out by the template.
        if (!Trimmed(parsed.reasoning).empty()) {
          EXPECT_EQ(Trimmed(parsed.reasoning), Trimmed(reasoning));
        }
        const json expected = m.value("tool_calls", json::array());
        ASSERT_EQ(parsed.tool_calls.size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i) {
          const json& fn = expected[i].at("function");
          json args = fn.at("arguments");
          if (args.is_string()) args = json::parse(args.get<std::string>());
          EXPECT_EQ(parsed.tool_calls[i].name, fn.at("name"));
          EXPECT_TRUE(parsed.tool_calls[i].complete);
          EXPECT_EQ(json::parse(parsed.tool_calls[i].arguments), args);
          ++calls;
        }
      }
    }
  }
  EXPECT_GE(turns, 15);
  EXPECT_GE(calls, 5);
}

// ---- tools ----

TEST(ReadToolSpecs, SchemaTypesAndErrors) {
  auto tools = Tools();
  ASSERT_EQ(tools->size(), 3u);
  const ToolSpec& typed = (*tools)[1];
  EXPECT_EQ(typed.params.at("ns").type, "string");
  EXPECT_TRUE(typed.params.at("ns").allows_null);
  EXPECT_EQ(typed.params.at("ni").type, "integer");
  EXPECT_TRUE(typed.params.at("ni").allows_null);
  EXPECT_TRUE((*tools)[2].params.empty());
  EXPECT_TRUE(ReadToolSpecs("null")->empty());
  for (std::string bad : std::vector<std::string>{
           "{}", "[1]", "[{\"function\": {}}]", "[{\"function\": {\"name\": \"\"}}]",
           "[{\"function\": {\"name\": \"f\", \"parameters\": 3}}]",
           std::string(200, '[') + std::string(200, ']')}) {
    Result<std::vector<ToolSpec>> r = ReadToolSpecs(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().ToString().find("tools"), std::string::npos) << r.status().ToString();
  }
  std::string many = "[";
  for (size_t i = 0; i <= kMaxTools; ++i) many += "{\"function\": {\"name\": \"f\"}},";
  many.back() = ']';
  EXPECT_FALSE(ReadToolSpecs(many).ok());
}

// ---- JSON shapes ----

TEST(ChatJson, MessageAndDeltas) {
  auto o = Options(ToolCallFormat::kHermes, ReasoningFormat::kQwen3);
  OutputParser parser(o);
  std::vector<json> deltas;
  for (std::string piece : {"Plan</think>", "Hi\n<tool_call>{\"name\": \"get_weather\", ",
                            "\"arguments\": {\"city\"", ": \"X\"}}</tool_call>"}) {
    MessageDelta d = parser.Feed(piece);
    if (!d.empty()) deltas.push_back(json::parse(ChatDeltaJson(d).dump()));
  }
  EXPECT_TRUE(parser.Finish().empty());
  ASSERT_EQ(deltas.size(), 4u);
  EXPECT_EQ(deltas[0], json::parse(R"({"reasoning": "Plan", "reasoning_content": "Plan"})"));
  EXPECT_EQ(deltas[1], json::parse(R"({"content": "Hi"})"));
  EXPECT_EQ(deltas[2], json::parse(R"({"tool_calls": [{"index": 0, "id": "call_0",
      "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\""}}]})"));
  EXPECT_EQ(deltas[3], json::parse(R"({"tool_calls": [{"index": 0,
      "function": {"arguments": ": \"X\"}"}}]})"));
  ParsedMessage m = parser.message();
  EXPECT_EQ(json::parse(ChatMessageJson(m).dump()), json::parse(R"({"role": "assistant",
      "content": "Hi", "reasoning": "Plan", "reasoning_content": "Plan", "tool_calls": [{"id":
      "call_0", "type": "function", "function": {"name": "get_weather",
      "arguments": "{\"city\": \"X\"}"}}]})"));
  EXPECT_EQ(json::parse(ChatMessageJson(Message("", "")).dump())["content"], "");
  EXPECT_TRUE(json::parse(ChatMessageJson(Message("", "")).dump())["reasoning"].is_null());
}

TEST(ChatJson, ToolCallIds) {
  std::string a = NewToolCallId(), b = NewToolCallId();
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(a.size(), 14u + 32u);
}

}  // namespace
}  // namespace moeserve::server
