#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "core/json.h"
#include "jinja/json_value.h"
#include "jinja/template.h"

namespace moeserve::tokenizer {

using jinja::Value;

struct ChatTemplate::Impl {
  std::string source;
  jinja::Template tmpl;
  // Special-token template variables in transformers' SPECIAL_TOKENS_ATTRIBUTES order; only the
  // ones the config sets (transformers leaves unset ones undefined, not None).
  jinja::Template::Context special_tokens;
};

namespace {

using Json = nlohmann::ordered_json;

// The variables apply_chat_template passes explicitly; extra keys may not shadow them (Python
// would raise "got multiple values for keyword argument").
constexpr std::string_view kReservedNames[] = {"messages", "tools", "documents",
                                               "add_generation_prompt"};

// A special token is a string or an AddedToken object {"content": ..., ...}.
Result<std::string> TokenContent(const Json& j, std::string_view field) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return InvalidArgument(
      "tokenizer_config.json: {} must be a string or an object with a "
      "string \"content\"",
      field);
}

Result<jinja::Template::Context> ReadSpecialTokens(const Json& config) {
  jinja::Template::Context tokens;
  for (const char* field : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token"}) {
    if (!config.contains(field) || config[field].is_null()) continue;
    ASSIGN_OR_RETURN(std::string content, TokenContent(config[field], field));
    tokens.emplace_back(field, Value::String(std::move(content)));
  }
  if (config.contains("additional_special_tokens") &&
      !config["additional_special_tokens"].is_null()) {
    const Json& list = config["additional_special_tokens"];
    if (!list.is_array()) {
      return InvalidArgument("tokenizer_config.json: additional_special_tokens must be a list");
    }
    std::vector<Value> items;
    for (const Json& item : list) {
      ASSIGN_OR_RETURN(std::string content, TokenContent(item, "additional_special_tokens"));
      items.push_back(Value::String(std::move(content)));
    }
    tokens.emplace_back("additional_special_tokens", Value::MakeList(std::move(items)));
  }
  return tokens;
}

Result<std::string> ReadTemplateSource(const Json& config) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    return NotFound("tokenizer_config.json has no chat_template");
  }
  const Json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    // Named templates (e.g. "default", "tool_use", "rag"): transformers renders "default" when no
    // name is asked for.
    std::string names;
    for (const Json& entry : t) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return InvalidArgument(
            "tokenizer_config.json: chat_template list entries must be "
            "{{\"name\": string, \"template\": string}}");
      }
      const std::string name = entry["name"].get<std::string>();
      if (name == "default") return entry["template"].get<std::string>();
      names += names.empty() ? name : ", " + name;
    }
    return NotFound("tokenizer_config.json: chat_template has no \"default\" entry (has: {})",
                    names);
  }
  return InvalidArgument("tokenizer_config.json: chat_template must be a string or a list");
}

Result<std::shared_ptr<const ChatTemplate::Impl>> MakeImpl(std::string source,
                                                           jinja::Template::Context special) {
  Result<jinja::Template> tmpl = jinja::Template::Parse(source);
  if (!tmpl.ok()) return tmpl.status().WithContext("chat template");
  return std::make_shared<const ChatTemplate::Impl>(
      ChatTemplate::Impl{std::move(source), std::move(tmpl).value(), std::move(special)});
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(std::string source) {
  ASSIGN_OR_RETURN(auto impl, MakeImpl(std::move(source), {}));
  return ChatTemplate(std::move(impl));
}

Result<ChatTemplate> ChatTemplate::FromTokenizerConfig(std::string_view tokenizer_config_json) {
  ASSIGN_OR_RETURN(const Json config,
                   ParseJson<Json>(tokenizer_config_json, "tokenizer_config.json"));
  if (!config.is_object()) return InvalidArgument("tokenizer_config.json: not a JSON object");
  ASSIGN_OR_RETURN(std::string source, ReadTemplateSource(config));
  ASSIGN_OR_RETURN(jinja::Template::Context special, ReadSpecialTokens(config));
  ASSIGN_OR_RETURN(auto impl, MakeImpl(std::move(source), std::move(special)));
  return ChatTemplate(std::move(impl));
}

Result<ChatTemplate> ChatTemplate::WithTemplate(std::string source) const {
  ASSIGN_OR_RETURN(auto impl, MakeImpl(std::move(source), impl_->special_tokens));
  return ChatTemplate(std::move(impl));
}

const std::string& ChatTemplate::source() const { return impl_->source; }

Result<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  ASSIGN_OR_RETURN(Value messages, jinja::ParseJsonValue(inputs.messages_json, "messages_json"));
  if (!messages.is_list()) return InvalidArgument("messages_json must be a JSON array");
  ASSIGN_OR_RETURN(Value tools, jinja::ParseJsonValue(inputs.tools_json, "tools_json"));
  if (!tools.is_list() && !tools.is_none()) {
    return InvalidArgument("tools_json must be a JSON array or null");
  }
  ASSIGN_OR_RETURN(Value extra, jinja::ParseJsonValue(inputs.extra_json, "extra_json"));
  if (!extra.is_dict()) return InvalidArgument("extra_json must be a JSON object");

  jinja::Template::Context context;
  context.emplace_back("messages", std::move(messages));
  context.emplace_back("tools", std::move(tools));
  context.emplace_back("documents", Value::None());
  context.emplace_back("add_generation_prompt", Value::Bool(inputs.add_generation_prompt));
  for (const auto& entry : impl_->special_tokens) context.push_back(entry);
  for (const auto& [key, value] : extra.AsDict().entries()) {
    const std::string& name = key.AsString();
    for (std::string_view reserved : kReservedNames) {
      if (name == reserved) {
        return InvalidArgument(
            "extra_json key '{}' collides with a variable the chat template "
            "always receives",
            name);
      }
    }
    context.emplace_back(name, value);
  }
  Result<std::string> text = impl_->tmpl.Render(context);
  if (!text.ok()) return text.status().WithContext("chat template");
  return text;
}

}  // namespace moeserve::tokenizer
