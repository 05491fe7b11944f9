// Parses and renders arbitrary bytes as a chat template over a fixed conversation: a Status or
// text, never a crash, a hang past libFuzzer's timeout, or unbounded recursion.
#include <cstdint>
#include <string>

#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tmpl = moeserve::tokenizer::ChatTemplate::Parse(
      std::string(reinterpret_cast<const char*>(data), size));
  if (!tmpl.ok()) return 0;
  moeserve::tokenizer::ChatTemplateInputs inputs;
  inputs.messages_json =
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"},)"
      R"( {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f",)"
      R"( "arguments": {"x": 1}}}]}])";
  inputs.tools_json = R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])";
  inputs.add_generation_prompt = true;
  inputs.extra_json = R"({"enable_thinking": false})";
  (void)tmpl->Render(inputs);
  return 0;
}
