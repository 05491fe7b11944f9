// libFuzzer target for the chat-template interpreter: arbitrary bytes as a template, parsed and,
// when they parse, rendered against a fixed chat context. Any input must end in text or an error
// Status: no crash, hang, leak (macro closures form reference cycles the interpreter must break)
// or unbounded memory.
//
// Input layout: the template source, optionally followed by "\x00" and a messages JSON array
// that replaces the default messages (so the fuzzer also explores the JSON-to-value path).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/chat_template.h"

namespace {

constexpr std::string_view kDefaultMessages = R"([
  {"role": "system", "content": "You are helpful."},
  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi é😀"}]},
  {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "reasoning_content": null,
   "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.0, "y": [1, "a", {"z": null}]}}}]},
  {"role": "tool", "content": "{\"ok\": true}"}
])";

constexpr std::string_view kTools =
    R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  std::string source(input.substr(0, split));
  moeserve::Result<moeserve::tokenizer::ChatTemplate> tmpl =
      moeserve::tokenizer::ChatTemplate::Parse(std::move(source));
  if (!tmpl.ok()) return 0;
  moeserve::tokenizer::ChatTemplateInputs inputs;
  inputs.messages_json =
      split == std::string_view::npos ? std::string(kDefaultMessages) : std::string(input.substr(split + 1));
  inputs.tools_json = std::string(kTools);
  inputs.add_generation_prompt = true;
  inputs.extra_json = R"({"enable_thinking": false})";
  (void)tmpl->Render(inputs);
  return 0;
}
