// The reasoning split of a chat answer (vLLM's --reasoning-parser qwen3 | deepseek_r1): the text a
// thinking model writes before `</think>` is `reasoning`, the rest is the message's content.
//
// ReasoningSplitter reads the output as it is detokenized, any number of bytes at a time, and
// decides each byte once: the split never depends on how the text was cut into pieces (a partial
// `</think>` is held back until the next bytes settle it). Cost: O(1) per byte.
//
//   qwen3        `<think>` at the start (after whitespace) is optional and dropped (Qwen3's
//                template lets the model write it, Qwen3.5's writes it into the prompt); text up
//                to `</think>` is reasoning; `<tool_call>` followed (after whitespace) by
//                `<function=` (or `<function` and whitespace) also ends reasoning (Qwen3.5 calls
//                tools from inside its thinking) and stays in the content for the tool parser;
//                an answer that ends inside thinking is all reasoning. With thinking disabled
//                there is no split: everything is content.
//   deepseek_r1  the same without the tool-call ending; thinking is always on.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace moeserve::server {

enum class ReasoningFormat { kNone, kQwen3, kDeepSeekR1 };

// "qwen3" | "deepseek_r1" | "none" (vLLM's names); else an InvalidArgument listing them.
Result<ReasoningFormat> ParseReasoningFormat(std::string_view name);
const char* ReasoningFormatName(ReasoningFormat format);

// True when a rendered prompt already closed the thinking block (it ends with `</think>` and
// whitespace, as Qwen3's and Qwen3.5's templates write it for enable_thinking=false): the answer
// then has no reasoning. vLLM checks the same on the prompt's token ids.
bool PromptClosesThinking(std::string_view prompt);

class ReasoningSplitter {
 public:
  // kNone, or qwen3 with thinking_enabled=false: every byte is content (deepseek_r1 always thinks).
  ReasoningSplitter(ReasoningFormat format, bool thinking_enabled);

  // Appends the decided part of `text` to *reasoning and *content.
  void Feed(std::string_view text, std::string* reasoning, std::string* content);
  // The output ended: what was held back is decided (a partial tag inside thinking is reasoning).
  void Finish(std::string* reasoning, std::string* content);

 private:
  enum class State {
    kStart,      // thinking: whitespace and a partial `<think>` held
    kReasoning,  // inside thinking; held_ is a partial `</think>` or `<tool_call>` ws `<function`
    kContent,    // after thinking: every byte is content
  };
  void Step(char c, std::string* reasoning, std::string* content);
  // held_ + c did not continue a tag: held_'s first byte is reasoning, the rest is read again.
  void Mismatch(char c, std::string* reasoning);

  State state_;
  bool tool_call_ends_reasoning_;
  std::string held_;
  // kReasoning, a `<tool_call>` lookahead: bytes of `<function` matched (-1: not in it); kStart:
  // bytes of `<think>` matched.
  int function_matched_ = -1;
  // Bytes to read again before the rest of the input (after a mismatch).
  std::string replay_;
  size_t replay_pos_ = 0;
};

}  // namespace moeserve::server
