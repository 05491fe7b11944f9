// Chat templates: renders the Jinja `chat_template` of a Hugging Face tokenizer_config.json
// exactly as transformers' apply_chat_template does, with moeserve's own Jinja interpreter
// (jinja/). JSON crosses this interface as text, so no JSON library type leaks out.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moeserve::tokenizer {

struct ChatTemplateInputs {
  std::string messages_json;        // JSON array of message objects
  std::string tools_json = "null";  // JSON array or null
  bool add_generation_prompt = false;
  std::string extra_json = "{}";  // JSON object of extra template variables (e.g. enable_thinking)
};

class ChatTemplate {
 public:
  // A template without special-token variables. Syntax errors name the line and construct.
  static Result<ChatTemplate> Parse(std::string source);

  // Reads "chat_template" (a string, or a list of {"name", "template"} from which "default" is
  // taken) and the special tokens (bos_token, eos_token, unk_token, sep_token, pad_token,
  // cls_token, mask_token, additional_special_tokens; strings or {"content": ...} objects) from
  // tokenizer_config.json text.
  static Result<ChatTemplate> FromTokenizerConfig(std::string_view tokenizer_config_json);

  // The same special tokens with another template: the CLI's --chat-template FILE.
  Result<ChatTemplate> WithTemplate(std::string source) const;

  // Renders with the context transformers builds: messages, tools (None when null),
  // documents = None, add_generation_prompt, the special tokens that are set, then the keys of
  // extra_json. Errors: malformed JSON inputs, a template error (with its line), or the message
  // of the template's raise_exception(...).
  Result<std::string> Render(const ChatTemplateInputs& inputs) const;

  const std::string& source() const;

  struct Impl;  // opaque: the parsed template and the special-token variables

 private:
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moeserve::tokenizer
