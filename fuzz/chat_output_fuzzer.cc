// A chat answer's text through the output parsers (server/output_parser.h). The first byte picks
// the parsers (tool calls: none, hermes, qwen3_xml; reasoning: none, qwen3, deepseek_r1; thinking
// on or off), the second how to cut the rest into stream deltas. Checks: the deltas concatenate
// to the non-streamed message; a complete call's arguments are a JSON object (when the answer is
// valid UTF-8, as the detokenizer's text is: invalid bytes pass through the parsers unchanged);
// nothing outside the calls is longer than the answer; the calls stay within their limits.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/output_parser.h"

namespace {

using namespace moeserve::server;

constexpr char kTools[] = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
  {"type": "function", "function": {"name": "typed", "parameters": {"type": "object",
    "properties": {"n": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"},
      "ns": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}])";

void Check(bool ok) {
  if (!ok) std::abort();
}

// UTF-8 as nlohmann's parser takes it (its strict dump throws where the parser would refuse).
bool IsUtf8(std::string_view text) {
  try {
    (void)nlohmann::json(std::string(text)).dump();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const auto tools =
      std::make_shared<const std::vector<ToolSpec>>(std::move(*ReadToolSpecs(kTools)));
  const uint8_t pick = data[0];
  const uint8_t stride = static_cast<uint8_t>(data[1] % 16 + 1);
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);

  OutputParserOptions options;
  options.tool_calls = static_cast<ToolCallFormat>(pick % 3);
  options.reasoning = static_cast<ReasoningFormat>((pick / 3) % 3);
  options.thinking_enabled = (pick / 9) % 2 == 0;
  options.tools = tools;
  options.limits.max_calls = 4;
  options.limits.max_argument_bytes = 256;
  auto ids = [] { return [n = 0]() mutable { return std::to_string(n++); }; };
  options.new_call_id = ids();
  const ParsedMessage whole = ParseOutput(options, text);

  // The same text in pieces of 1..16 bytes (sizes cycling from the second byte).
  options.new_call_id = ids();
  OutputParser parser(options);
  ParsedMessage streamed;
  auto take = [&](const MessageDelta& d) {
    streamed.reasoning += d.reasoning;
    streamed.content += d.content;
    for (const ToolCallDelta& c : d.tool_calls) {
      if (!c.id.empty()) {
        Check(c.index == streamed.tool_calls.size());
        streamed.tool_calls.push_back(
            {.id = c.id, .name = c.name, .arguments = "", .complete = false});
      }
      Check(c.index + 1 == streamed.tool_calls.size());
      streamed.tool_calls[c.index].arguments += c.arguments;
    }
  };
  size_t at = 0;
  for (size_t piece = stride; at < text.size(); piece = piece % 16 + 1) {
    take(parser.Feed(text.substr(at, piece)));
    at += std::min(piece, text.size() - at);
  }
  take(parser.Finish());

  Check(streamed.reasoning == whole.reasoning);
  Check(streamed.content == whole.content);
  Check(streamed.tool_calls.size() == whole.tool_calls.size());
  Check(whole.tool_calls.size() <= options.limits.max_calls);
  Check(whole.reasoning.size() + whole.content.size() <= text.size());
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    const ToolCall& call = whole.tool_calls[i];
    Check(streamed.tool_calls[i].id == call.id && streamed.tool_calls[i].name == call.name &&
          streamed.tool_calls[i].arguments == call.arguments);
    Check(call.arguments.size() <= options.limits.max_argument_bytes);
    if (call.complete && IsUtf8(text)) {
      Check(nlohmann::json::accept(call.arguments) && call.arguments.front() == '{');
    }
  }
  return 0;
}
