#include "server/output_parser.h"

namespace moeserve::server {

using nlohmann::ordered_json;

OutputParser::OutputParser(OutputParserOptions options)
    : reasoning_(options.reasoning, options.thinking_enabled),
      tool_calls_(options.tool_calls, std::move(options.tools), options.limits,
                  std::move(options.new_call_id)) {}

MessageDelta OutputParser::Feed(std::string_view text) {
  MessageDelta d;
  scratch_.clear();
  reasoning_.Feed(text, &d.reasoning, &scratch_);
  tool_calls_.Feed(scratch_, &d.content, &d.tool_calls);
  reasoning_text_ += d.reasoning;
  content_text_ += d.content;
  return d;
}

MessageDelta OutputParser::Finish() {
  MessageDelta d;
  scratch_.clear();
  reasoning_.Finish(&d.reasoning, &scratch_);
  tool_calls_.Feed(scratch_, &d.content, &d.tool_calls);
  tool_calls_.Finish(&d.content, &d.tool_calls);
  reasoning_text_ += d.reasoning;
  content_text_ += d.content;
  return d;
}

ParsedMessage OutputParser::message() const {
  return {
      .reasoning = reasoning_text_, .content = content_text_, .tool_calls = tool_calls_.calls()};
}

ParsedMessage ParseOutput(const OutputParserOptions& options, std::string_view text) {
  OutputParser parser(options);
  parser.Feed(text);
  parser.Finish();
  return parser.message();
}

ParserChoice ChooseParsers(std::string_view chat_template) {
  auto has = [&](std::string_view s) { return chat_template.find(s) != std::string_view::npos; };
  ParserChoice choice;
  if (has("<function=") && has("<parameter=")) {
    choice.tool_calls = ToolCallFormat::kQwen3Xml;
  } else if (has("<tool_call>")) {
    choice.tool_calls = ToolCallFormat::kHermes;
  }
  if (has("<think>") || has("</think>")) {
    choice.reasoning =
        has("<｜Assistant｜>") ? ReasoningFormat::kDeepSeekR1 : ReasoningFormat::kQwen3;
  }
  return choice;
}

namespace {

ordered_json TextOrNull(const std::string& s) {
  return s.empty() ? ordered_json(nullptr) : ordered_json(s);
}

}  // namespace

ordered_json ChatMessageJson(const ParsedMessage& message) {
  ordered_json calls = ordered_json::array();
  for (const ToolCall& call : message.tool_calls) {
    calls.push_back({{"id", call.id},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  }
  ordered_json content = message.content;
  if (message.content.empty() && !message.tool_calls.empty()) content = nullptr;
  return {{"role", "assistant"},
          {"content", content},
          {"reasoning", TextOrNull(message.reasoning)},
          {"reasoning_content", TextOrNull(message.reasoning)},
          {"tool_calls", calls}};
}

ordered_json ChatDeltaJson(const MessageDelta& delta) {
  ordered_json d = ordered_json::object();
  if (!delta.reasoning.empty()) {
    d["reasoning"] = delta.reasoning;
    d["reasoning_content"] = delta.reasoning;
  }
  if (!delta.content.empty()) d["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const ToolCallDelta& call : delta.tool_calls) {
      ordered_json c = {{"index", call.index}};
      ordered_json fn = ordered_json::object();
      if (!call.id.empty()) {
        c["id"] = call.id;
        c["type"] = "function";
        fn["name"] = call.name;
      }
      if (!call.arguments.empty() || call.id.empty()) fn["arguments"] = call.arguments;
      c["function"] = fn;
      calls.push_back(std::move(c));
    }
    d["tool_calls"] = std::move(calls);
  }
  return d;
}

const char* ChatFinishReason(const ParsedMessage& message, const char* engine_reason) {
  if (!message.tool_calls.empty() && message.tool_calls.back().complete) return "tool_calls";
  return engine_reason;
}

}  // namespace moeserve::server
