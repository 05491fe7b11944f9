#include "server/reasoning_parser.h"

namespace moeserve::server {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCallStart = "<tool_call>";
constexpr std::string_view kFunctionStart = "<function";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

bool StartsWith(std::string_view tag, std::string_view prefix) {
  return prefix.size() <= tag.size() && tag.substr(0, prefix.size()) == prefix;
}

}  // namespace

Result<ReasoningFormat> ParseReasoningFormat(std::string_view name) {
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "none") return ReasoningFormat::kNone;
  return InvalidArgument("unknown reasoning parser '{}' (known: qwen3, deepseek_r1, none)", name);
}

const char* ReasoningFormatName(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kQwen3:
      return "qwen3";
    case ReasoningFormat::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningFormat::kNone:
      break;
  }
  return "none";
}

bool PromptClosesThinking(std::string_view prompt) {
  while (!prompt.empty() && IsSpace(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kThinkEnd);
}

ReasoningSplitter::ReasoningSplitter(ReasoningFormat format, bool thinking_enabled)
    : state_(format == ReasoningFormat::kNone ||
                     (format == ReasoningFormat::kQwen3 && !thinking_enabled)
                 ? State::kContent
                 : State::kStart),
      tool_call_ends_reasoning_(format == ReasoningFormat::kQwen3) {}

void ReasoningSplitter::Feed(std::string_view text, std::string* reasoning, std::string* content) {
  if (state_ == State::kContent) {  // the common case after thinking: no per-byte work
    content->append(text);
    return;
  }
  for (char c : text) {
    Step(c, reasoning, content);
    while (replay_pos_ < replay_.size()) Step(replay_[replay_pos_++], reasoning, content);
    replay_.clear();
    replay_pos_ = 0;
  }
}

void ReasoningSplitter::Finish(std::string* reasoning, std::string* content) {
  if (state_ != State::kContent) reasoning->append(held_);
  held_.clear();
  function_matched_ = -1;
}

void ReasoningSplitter::Mismatch(char c, std::string* reasoning) {
  reasoning->push_back(held_[0]);
  std::string again = held_.substr(1);
  again.push_back(c);
  again.append(replay_, replay_pos_);
  replay_ = std::move(again);
  replay_pos_ = 0;
  held_.clear();
  function_matched_ = -1;
}

void ReasoningSplitter::Step(char c, std::string* reasoning, std::string* content) {
  switch (state_) {
    case State::kContent:
      content->push_back(c);
      return;
    case State::kStart: {
      // held_ is whitespace then the first function_matched_ bytes of `<think>` (reused as a
      // count).
      int matched = function_matched_ < 0 ? 0 : function_matched_;
      if (matched == 0 && IsSpace(c)) {
        held_.push_back(c);
        return;
      }
      if (kThinkStart[matched] == c) {
        held_.push_back(c);
        function_matched_ = matched + 1;
        if (function_matched_ == static_cast<int>(kThinkStart.size())) {  // dropped, as vLLM does
          held_.clear();
          function_matched_ = -1;
          state_ = State::kReasoning;
        }
        return;
      }
      // No `<think>`: the answer starts inside thinking; read the held bytes again as reasoning.
      state_ = State::kReasoning;
      std::string again = std::move(held_);
      again.push_back(c);
      again.append(replay_, replay_pos_);
      replay_ = std::move(again);
      replay_pos_ = 0;
      held_.clear();
      function_matched_ = -1;
      return;
    }
    case State::kReasoning:
      break;
  }
  if (held_.empty()) {
    if (c == '<') {
      held_.push_back(c);
    } else {
      reasoning->push_back(c);
    }
    return;
  }
  if (function_matched_ >= 0) {  // after `<tool_call>`: whitespace, then `<function`?
    if (function_matched_ == 0 && IsSpace(c)) {
      held_.push_back(c);
    } else if (function_matched_ < static_cast<int>(kFunctionStart.size()) &&
               kFunctionStart[function_matched_] == c) {
      held_.push_back(c);
      ++function_matched_;
    } else if (function_matched_ == static_cast<int>(kFunctionStart.size()) &&
               (c == '=' || IsSpace(c))) {  // vLLM's `<function[\s=]`
      held_.push_back(c);
      content->append(held_);  // the call is the tool parser's
      held_.clear();
      function_matched_ = -1;
      state_ = State::kContent;
    } else {
      Mismatch(c, reasoning);
    }
    return;
  }
  held_.push_back(c);
  if (StartsWith(kThinkEnd, held_)) {
    if (held_.size() == kThinkEnd.size()) {
      held_.clear();
      state_ = State::kContent;
    }
    return;
  }
  if (tool_call_ends_reasoning_ && StartsWith(kToolCallStart, held_)) {
    if (held_.size() == kToolCallStart.size()) function_matched_ = 0;
    return;
  }
  held_.pop_back();
  Mismatch(c, reasoning);
}

}  // namespace moeserve::server
