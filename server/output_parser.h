// A chat answer as an OpenAI message: the reasoning split (reasoning_parser.h) and then the tool
// calls in the rest (tool_call_parser.h), on text as the detokenizer produces it.
//
// For the server: make one OutputParser per choice of a chat request that has a reasoning parser
// or tools (tool_choice not "none"); Feed it each text delta of the choice and send
// ChatDeltaJson(delta) when the delta is not empty; at the choice's end call Finish (it may
// release held text) and send that delta too, with ChatFinishReason. Non-streamed: ParseOutput on
// the whole text, then ChatMessageJson. Both give the same message: a stream's deltas
// concatenated equal ParseOutput's message for every way of cutting the text into pieces
// (output_parser_test checks every cut of many answers).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace moeserve::server {

struct OutputParserOptions {
  ReasoningFormat reasoning = ReasoningFormat::kNone;
  // chat_template_kwargs.enable_thinking (true when not given), false also when the prompt
  // closed thinking itself (PromptClosesThinking).
  bool thinking_enabled = true;
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  // The request's tools (ReadToolSpecs); shared by a request's choices.
  std::shared_ptr<const std::vector<ToolSpec>> tools;
  ToolCallLimits limits;
  std::function<std::string()> new_call_id = NewToolCallId;
};

// What one Feed or Finish adds to the message. Concatenating every delta's fields (and each
// call's arguments by index) gives the message.
struct MessageDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedMessage {
  std::string reasoning;  // "" when none
  std::string content;    // "" when none
  std::vector<ToolCall> tool_calls;
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  // The next text of the answer (any number of bytes).
  MessageDelta Feed(std::string_view text);
  // The answer ended (stop, length, abort): held text is decided.
  MessageDelta Finish();
  // The message so far (after Finish: the whole message). Copies the calls: call it once.
  ParsedMessage message() const;

 private:
  ReasoningSplitter reasoning_;
  ToolCallParser tool_calls_;
  std::string reasoning_text_;
  std::string content_text_;
  std::string scratch_;  // the content part of a delta, before the tool parser
};

// The whole answer at once: Feed(text) then Finish().
ParsedMessage ParseOutput(const OutputParserOptions& options, std::string_view text);

// `auto`: the parsers a chat template's text asks for. Tool calls: `<function=` and
// `<parameter=` -> qwen3_xml (Qwen3.5, Qwen3-Coder), else `<tool_call>` -> hermes (Qwen3,
// Qwen3-Next), else none. Reasoning: `<think>` or `</think>` -> qwen3 (deepseek_r1 when the
// template is DeepSeek's, `<｜Assistant｜>`), else none.
struct ParserChoice {
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  ReasoningFormat reasoning = ReasoningFormat::kNone;
};
ParserChoice ChooseParsers(std::string_view chat_template);

// The OpenAI shapes. A message: {"role": "assistant", "content", "reasoning",
// "reasoning_content", "tool_calls": [{"id", "type": "function", "function": {"name",
// "arguments"}}]}; content is null when it is empty and there are calls, reasoning (and its older
// name reasoning_content) null when there is none. A delta: only the fields it carries; a call's
// first element has index, id, type and function.name, later ones index and function.arguments.
nlohmann::ordered_json ChatMessageJson(const ParsedMessage& message);
nlohmann::ordered_json ChatDeltaJson(const MessageDelta& delta);

// "tool_calls" when the message has calls and the last one is complete; else the engine's reason
// (a call cut off by max_tokens keeps "length").
const char* ChatFinishReason(const ParsedMessage& message, const char* engine_reason);

}  // namespace moeserve::server
