#include "server/openai_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <random>

#include "core/check.h"
#include "core/json.h"
#include "engine/sampling_json.h"

namespace moeserve::server {
namespace {

using engine::ApplySamplingKey;

// `s` cut to at most `max` bytes at a UTF-8 character's start, "..." marking the cut.
std::string Truncated(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return fmt::format("{}...", s.substr(0, end));
}

// Text offsets count characters, as Python's len() does (a U+FFFD for a broken byte is one).
int64_t CountCodePoints(std::string_view text) {
  int64_t n = 0;
  for (unsigned char b : text) n += (b & 0xC0) != 0x80;
  return n;
}

// JSON has no -inf: a token the model rules out gets vLLM's API floor.
float ApiLogprob(float logprob) { return std::max(logprob, -9999.0f); }

Status ReadBool(const json& v, std::string_view key, bool* out) {
  if (!v.is_boolean()) return InvalidArgument("\"{}\" must be true or false", key);
  *out = v.get<bool>();
  return OkStatus();
}

// One prompt: a non-empty string or list of token ids.
Result<GenerationRequest::Prompt> ReadOnePrompt(const json& v) {
  GenerationRequest::Prompt prompt;
  if (v.is_string()) {
    prompt.text = v.get<std::string>();
    if (prompt.text->empty()) return InvalidArgument("\"prompt\" is empty");
    return prompt;
  }
  if (!v.is_array()) return InvalidArgument("\"prompt\" must be a string or a list of token ids");
  if (v.empty()) return InvalidArgument("\"prompt\" is empty");
  for (const json& id : v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidArgument("\"prompt\": {} is not a token id", id.dump());
    }
    prompt.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return prompt;
}

// "prompt": a string, a list of token ids, or (vLLM's batch form) a list of those.
Status ReadPrompts(const json& v, GenerationRequest* r) {
  if (v.is_array() && !v.empty() && (v[0].is_string() || v[0].is_array())) {
    for (const json& one : v) {
      ASSIGN_OR_RETURN(GenerationRequest::Prompt prompt, ReadOnePrompt(one));
      r->prompts.push_back(std::move(prompt));
    }
    return OkStatus();
  }
  ASSIGN_OR_RETURN(GenerationRequest::Prompt prompt, ReadOnePrompt(v));
  r->prompts.push_back(std::move(prompt));
  return OkStatus();
}

// One part of a message's content list as text, as vLLM's _parse_chat_message_content_part
// reads it: a string, or a text-like part ({"type": "text", "text": ...} and the Responses API's
// spellings; refusal and thinking parts give their own field). nullopt: a text part without its
// text, which vLLM skips.
Result<std::optional<std::string>> ContentPartText(const json& part) {
  if (part.is_string()) return std::optional<std::string>(part.get<std::string>());
  if (!part.is_object()) {
    return InvalidArgument("\"messages\": a content part must be an object or a string");
  }
  const auto type = part.find("type");
  if (type == part.end() || type->is_null()) {
    return InvalidArgument("\"messages\": a content part has no \"type\"");
  }
  if (!type->is_string()) {
    return InvalidArgument("\"messages\": a content part's \"type\" must be a string");
  }
  const std::string& name = type->get_ref<const std::string&>();
  const char* field = name == "text" || name == "input_text" || name == "output_text" ? "text"
                      : name == "refusal"                                             ? "refusal"
                      : name == "thinking"                                            ? "thinking"
                                                                                      : nullptr;
  if (field == nullptr) {
    return InvalidArgument(
        "\"messages\": content parts of type \"{}\" are not supported: this model reads text "
        "only",
        Truncated(name, 64));
  }
  const auto text = part.find(field);
  if (text == part.end() || text->is_null()) return std::optional<std::string>();
  if (!text->is_string()) {
    return InvalidArgument("\"messages\": the \"{}\" of a content part must be a string", field);
  }
  return std::optional<std::string>(text->get<std::string>());
}

Status ReadStreamOptions(const json& v, GenerationRequest* r) {
  if (!v.is_object()) return InvalidArgument("\"stream_options\" must be an object");
  for (const auto& [key, value] : v.items()) {
    if (key == "include_usage" && !value.is_null()) {
      RETURN_IF_ERROR(ReadBool(value, "stream_options", &r->include_usage));
    }
  }
  return OkStatus();
}

// Keys only chat has: the template's inputs and chat's spelling of logprobs.
// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": N}}.
Status ReadToolChoice(const json& value, GenerationRequest* r) {
  using ToolChoice = GenerationRequest::ToolChoice;
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s == "none") {
      r->tool_choice = ToolChoice::kNone;
    } else if (s == "auto") {
      r->tool_choice = ToolChoice::kAuto;
    } else if (s == "required") {
      r->tool_choice = ToolChoice::kRequired;
    } else {
      return InvalidArgument(
          "\"tool_choice\" must be none, auto, required or a function, got \"{}\"",
          Truncated(s, 64));
    }
    return OkStatus();
  }
  const json* name = nullptr;
  if (value.is_object() && value.value("type", json()) == "function" &&
      value.contains("function") && value["function"].is_object() &&
      value["function"].contains("name")) {
    name = &value["function"]["name"];
  }
  if (name == nullptr || !name->is_string()) {
    return InvalidArgument(
        "\"tool_choice\" must be none, auto, required or {{\"type\": \"function\", \"function\": "
        "{{\"name\": ...}}}}");
  }
  r->tool_choice = ToolChoice::kFunction;
  r->tool_choice_name = name->get<std::string>();
  return OkStatus();
}

// The tools the answer's parser reads, and tool_choice checked against them.
Status ReadTools(GenerationRequest* r) {
  using ToolChoice = GenerationRequest::ToolChoice;
  if (r->tools_json != "null") {
    ASSIGN_OR_RETURN(std::vector<ToolSpec> tools, ReadToolSpecs(r->tools_json));
    if (!tools.empty()) r->tools = std::make_shared<const std::vector<ToolSpec>>(std::move(tools));
  }
  if (r->tool_choice == ToolChoice::kRequired || r->tool_choice == ToolChoice::kFunction) {
    if (r->tools == nullptr) {
      return InvalidArgument(
          "\"tool_choice\": {} needs \"tools\"",
          r->tool_choice == ToolChoice::kRequired ? "\"required\"" : "a function");
    }
  }
  if (r->tool_choice == ToolChoice::kFunction) {
    const auto& tools = *r->tools;
    if (std::none_of(tools.begin(), tools.end(),
                     [&](const ToolSpec& t) { return t.name == r->tool_choice_name; })) {
      return InvalidArgument("\"tool_choice\": no tool named \"{}\" in \"tools\"",
                             Truncated(r->tool_choice_name, 128));
    }
  }
  return OkStatus();
}

// reasoning_effort "none" turns thinking off through the template (enable_thinking false),
// unless chat_template_kwargs says otherwise; other efforts change nothing for Qwen's models.
Status ApplyReasoningEffort(const std::string& effort, GenerationRequest* r) {
  if (effort.empty()) return OkStatus();
  static constexpr std::string_view kEfforts[] = {"none", "minimal", "low", "medium", "high"};
  if (std::find(std::begin(kEfforts), std::end(kEfforts), effort) == std::end(kEfforts)) {
    return InvalidArgument(
        "\"reasoning_effort\" must be none, minimal, low, medium or high, got \"{}\"",
        Truncated(effort, 64));
  }
  if (effort != "none") return OkStatus();
  json kwargs = json::parse(r->chat_template_kwargs_json);
  if (!kwargs.contains("enable_thinking")) {
    kwargs["enable_thinking"] = false;
    r->chat_template_kwargs_json = kwargs.dump();
  }
  return OkStatus();
}

Status ReadChatKey(const std::string& key, const json& value, GenerationRequest* r,
                   std::optional<bool>* logprobs, std::optional<int64_t>* top_logprobs,
                   std::string* reasoning_effort, bool* handled) {
  *handled = true;
  if (key == "messages") {
    if (value.is_array() && value.empty()) return InvalidArgument("\"messages\" is empty");
    ASSIGN_OR_RETURN(r->messages_json, ChatMessagesJson(value));
  } else if (key == "tools") {
    if (!value.is_null() && !value.is_array()) {
      return InvalidArgument("\"tools\" must be a list of tools");
    }
    r->tools_json = value.dump();
  } else if (key == "add_generation_prompt") {
    RETURN_IF_ERROR(ReadBool(value, key, &r->add_generation_prompt));
  } else if (key == "chat_template_kwargs") {
    if (!value.is_object()) return InvalidArgument("\"chat_template_kwargs\" must be an object");
    r->chat_template_kwargs_json = value.dump();
  } else if (key == "logprobs") {
    bool b = false;
    RETURN_IF_ERROR(ReadBool(value, key, &b));
    *logprobs = b;
  } else if (key == "top_logprobs") {
    if (!value.is_number_integer()) return InvalidArgument("\"top_logprobs\" must be an integer");
    *top_logprobs = value.get<int64_t>();
  } else if (key == "tool_choice") {
    RETURN_IF_ERROR(ReadToolChoice(value, r));
  } else if (key == "parallel_tool_calls") {
    RETURN_IF_ERROR(ReadBool(value, key, &r->parallel_tool_calls));
  } else if (key == "reasoning_effort") {
    if (!value.is_string()) return InvalidArgument("\"reasoning_effort\" must be a string");
    *reasoning_effort = value.get<std::string>();
  } else if (key == "max_completion_tokens") {
    // OpenAI's newer name of max_tokens.
    bool known = false;
    RETURN_IF_ERROR(ApplySamplingKey("max_tokens", value, r->params, &known));
    r->max_tokens_given = true;
  } else {
    *handled = false;
  }
  return OkStatus();
}

}  // namespace

namespace {

// Call arguments given as JSON text reach the template verbatim, keys in the client's order
// (a parsed nlohmann::json would sort them): while the messages are normalized each is a marker
// string, spliced back as text into the dumped messages.
struct VerbatimArguments {
  std::string marker;  // a per-request prefix no client text can guess
  std::vector<std::string> texts;
};

// An earlier assistant turn as the template reads it: each call's arguments an object (checked
// JSON text, kept verbatim), and the reasoning under both of its names.
Status NormalizeAssistantTurn(size_t index, json& message, VerbatimArguments* verbatim) {
  const auto reasoning = message.find("reasoning");
  if (reasoning != message.end() && reasoning->is_string() &&
      !message.contains("reasoning_content")) {
    message["reasoning_content"] = *reasoning;
  }
  const auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return OkStatus();
  if (!calls->is_array()) {
    return InvalidArgument("\"messages\"[{}]: \"tool_calls\" must be a list", index);
  }
  for (size_t j = 0; j < calls->size(); ++j) {
    json& call = (*calls)[j];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
      return InvalidArgument("\"messages\"[{}].tool_calls[{}]: needs a \"function\" object", index,
                             j);
    }
    json& arguments = call["function"]["arguments"];
    if (!arguments.is_string()) continue;
    const std::string& text = arguments.get_ref<const std::string&>();
    Result<json> parsed = ParseJson(text, "");
    if (!parsed.ok()) {
      return InvalidArgument("\"messages\"[{}].tool_calls[{}].function.arguments: {}", index, j,
                             parsed.status().message());
    }
    if (!parsed->is_object()) {
      return InvalidArgument("\"messages\"[{}].tool_calls[{}].function.arguments: not an object",
                             index, j);
    }
    std::string marker = verbatim->marker + std::to_string(verbatim->texts.size());
    verbatim->texts.push_back(text);
    arguments = std::move(marker);
  }
  return OkStatus();
}

}  // namespace

Result<std::string> ChatMessagesJson(const json& messages) {
  if (!messages.is_array()) return InvalidArgument("\"messages\" must be a list of messages");
  thread_local std::mt19937_64 rng(std::random_device{}());
  VerbatimArguments verbatim{fmt::format("\x01arguments {:016x}{:016x} ", rng(), rng()), {}};
  json out = json::array();
  for (const json& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return InvalidArgument("\"messages\": each message must be an object with a \"role\"");
    }
    json message = m;
    json& content = message["content"];
    if (content.is_array()) {
      // vLLM's "string" content format: the text parts joined by newlines.
      std::string joined;
      bool first = true;
      for (const json& part : content) {
        ASSIGN_OR_RETURN(std::optional<std::string> text, ContentPartText(part));
        if (!text) continue;
        if (!first) joined += '\n';
        joined += *text;
        first = false;
      }
      content = std::move(joined);
    } else if (content.is_null()) {
      content = "";  // vLLM's too: no parts, joined
    } else if (!content.is_string()) {
      return InvalidArgument(
          "\"messages\": a message's \"content\" must be a string or a list of content parts");
    }
    if (message["role"] == "assistant")
      RETURN_IF_ERROR(NormalizeAssistantTurn(out.size(), message, &verbatim));
    out.push_back(std::move(message));
  }
  std::string text = out.dump();
  if (verbatim.texts.empty()) return text;
  // One pass: the markers come in order, each as a JSON string "<marker><k>".
  const std::string quoted = json(verbatim.marker).dump();
  const std::string_view open(quoted.data(), quoted.size() - 1);  // without the closing quote
  std::string spliced;
  size_t at = 0;
  for (const std::string& arguments : verbatim.texts) {
    const size_t found = text.find(open, at);
    CHECK(found != std::string::npos) << "a call's arguments marker went missing";
    const size_t end = text.find('"', found + open.size());
    spliced.append(text, at, found - at);
    spliced += arguments;
    at = end + 1;
  }
  spliced.append(text, at, std::string::npos);
  return spliced;
}

Result<GenerationRequest> ParseGenerationRequest(const json& body, Endpoint endpoint,
                                                 const engine::SamplingParams& defaults,
                                                 std::string_view body_text) {
  if (!body.is_object()) return InvalidArgument("the request body must be a JSON object");
  RETURN_IF_ERROR(engine::CheckOneStructuredOutput(body));
  GenerationRequest r;
  r.params = defaults;
  r.endpoint = endpoint;
  r.add_special_tokens = endpoint == Endpoint::kCompletions;
  const bool chat = endpoint == Endpoint::kChat;
  std::optional<bool> chat_logprobs;
  std::optional<int64_t> top_logprobs;
  std::string reasoning_effort;
  bool stream_options_given = false;
  bool has_prompt = false;
  for (const auto& [key, value] : body.items()) {
    if (value.is_null()) continue;  // vLLM reads null as "not given"
    if (chat) {
      bool handled = false;
      RETURN_IF_ERROR(
          ReadChatKey(key, value, &r, &chat_logprobs, &top_logprobs, &reasoning_effort, &handled));
      if (handled) continue;
    }
    bool sampling = false;
    RETURN_IF_ERROR(ApplySamplingKey(key, value, r.params, &sampling));
    if (sampling) {
      if (key == "max_tokens") r.max_tokens_given = true;
      continue;
    }
    if (key == "model") {
      if (!value.is_string()) return InvalidArgument("\"model\" must be a string");
      r.model = value.get<std::string>();
    } else if (key == "prompt" && !chat) {
      RETURN_IF_ERROR(ReadPrompts(value, &r));
      has_prompt = true;
    } else if (key == "stream") {
      RETURN_IF_ERROR(ReadBool(value, key, &r.stream));
    } else if (key == "stream_options") {
      RETURN_IF_ERROR(ReadStreamOptions(value, &r));
      stream_options_given = true;
    } else if (key == "add_special_tokens") {
      RETURN_IF_ERROR(ReadBool(value, key, &r.add_special_tokens));
    } else if (key == "echo" && !chat) {
      RETURN_IF_ERROR(ReadBool(value, key, &r.echo));
    }
    // Other keys (user, suffix, tool_choice, ...) are accepted and ignored, as vLLM ignores the
    // fields it does not use.
  }
  if (chat) {
    if (r.messages_json.empty()) return InvalidArgument("\"messages\" is required");
    // The tools as the client wrote them: the template shows them to the model in that order.
    if (std::optional<std::string_view> raw = RawJsonMember(body_text, {"tools"});
        raw && !raw->empty() && raw->front() == '[') {
      r.tools_json = std::string(*raw);
    }
    RETURN_IF_ERROR(ReadTools(&r));
    RETURN_IF_ERROR(ApplyReasoningEffort(reasoning_effort, &r));
    // vLLM's check; the upper bound is --max-logprobs' (request_check.cc).
    if (top_logprobs && *top_logprobs < -1) {
      return InvalidArgument("top_logprobs must be non-negative or -1, got {}", *top_logprobs);
    }
    if (top_logprobs && !chat_logprobs.value_or(false) && *top_logprobs != 0) {
      return InvalidArgument("top_logprobs needs \"logprobs\": true");
    }
    if (chat_logprobs.value_or(false)) r.params.logprobs = top_logprobs.value_or(0);
  } else if (!has_prompt) {
    return InvalidArgument("\"prompt\" is required");
  }
  if (!body_text.empty()) engine::KeepSchemaOrder(body_text, r.params);
  r.return_prompt_logprobs = r.params.prompt_logprobs.has_value();
  // vLLM: echoed logprobs cover the prompt, so echo with logprobs asks for prompt logprobs.
  if (r.echo && r.params.logprobs) {
    const int64_t asked = r.params.prompt_logprobs.value_or(0);
    r.params.prompt_logprobs = asked == -1 || *r.params.logprobs == -1
                                   ? -1  // the whole vocabulary
                                   : std::max(asked, *r.params.logprobs);
  }
  if (stream_options_given && !r.stream) {
    return InvalidArgument("stream_options can only be set when stream is true");
  }
  return r;
}

std::string NewRequestId(Endpoint endpoint) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}-{:016x}{:016x}", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl", rng(),
                     rng());
}

const char* FinishReasonJson(engine::FinishReason reason) {
  return engine::FinishReasonName(reason);
}

ordered_json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

ordered_json CompletionLogprobsJson(const tokenizer::Tokenizer& tok,
                                    const std::vector<engine::SampledToken>& logprobs,
                                    int64_t* text_offset) {
  ordered_json tokens = ordered_json::array(), token_logprobs = ordered_json::array(),
               top_logprobs = ordered_json::array(), text_offset_json = ordered_json::array();
  for (const engine::SampledToken& s : logprobs) {
    // vLLM writes each token as it decodes alone.
    const std::string text = tok.Decode(std::span(&s.token, 1));
    tokens.push_back(text);
    token_logprobs.push_back(ApiLogprob(s.sampled.logprob));
    ordered_json top = ordered_json::object();
    for (const engine::TokenLogprob& t : s.top) {
      top[tok.Decode(std::span(&t.token, 1))] = ApiLogprob(t.logprob);
    }
    top_logprobs.push_back(std::move(top));
    text_offset_json.push_back(*text_offset);
    *text_offset += CountCodePoints(text);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset_json)}};
}

ordered_json EchoedPromptLogprobsJson(const tokenizer::Tokenizer& tok,
                                      const std::vector<int32_t>& prompt,
                                      const std::vector<engine::SampledToken>& prompt_logprobs,
                                      int64_t* text_offset) {
  const std::string first =
      tok.Decode(std::span(prompt.data(), std::min<size_t>(1, prompt.size())));
  ordered_json out = {{"tokens", {first}},
                      {"token_logprobs", {nullptr}},
                      {"top_logprobs", {nullptr}},
                      {"text_offset", {*text_offset}}};
  *text_offset += CountCodePoints(first);
  AppendCompletionLogprobs(out, CompletionLogprobsJson(tok, prompt_logprobs, text_offset));
  return out;
}

void AppendCompletionLogprobs(ordered_json& into, const ordered_json& more) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const ordered_json& v : more[key]) into[key].push_back(v);
  }
}

ordered_json PromptLogprobsJson(const tokenizer::Tokenizer& tok,
                                const std::vector<engine::SampledToken>& prompt_logprobs) {
  const auto entry = [&](const engine::TokenLogprob& t) {
    return ordered_json{{"logprob", ApiLogprob(t.logprob)},
                        {"rank", t.rank},
                        {"decoded_token", tok.Decode(std::span(&t.token, 1))}};
  };
  ordered_json out = ordered_json::array({nullptr});
  for (const engine::SampledToken& s : prompt_logprobs) {
    ordered_json position = ordered_json::object();
    position[std::to_string(s.token)] = entry(s.sampled);
    // The top ids are distinct, so only the prompt's own token may be among them: the entries
    // are appended unchecked (ordered_json's operator[] searches its list, which made a
    // whole-vocabulary position quadratic).
    auto& entries = static_cast<ordered_json::object_t::Container&>(
        position.get_ref<ordered_json::object_t&>());
    for (const engine::TokenLogprob& t : s.top) {
      if (t.token != s.sampled.token) entries.emplace_back(std::to_string(t.token), entry(t));
    }
    out.push_back(std::move(position));
  }
  return out;
}

ordered_json ChatLogprobsContentJson(const tokenizer::Tokenizer& tok,
                                     const std::vector<engine::SampledToken>& logprobs,
                                     int64_t num_top) {
  // {"token", "logprob", "bytes"}: bytes are the token's own, which may be part of a character.
  const auto entry = [&](int32_t id, float logprob) {
    const std::string text = tok.Decode(std::span(&id, 1));
    ordered_json bytes = ordered_json::array();
    const std::string raw(tok.TokenBytes(id).value_or(std::string_view()));
    for (unsigned char b : raw) bytes.push_back(b);
    return ordered_json{{"token", text}, {"logprob", ApiLogprob(logprob)}, {"bytes", bytes}};
  };
  ordered_json content = ordered_json::array();
  for (const engine::SampledToken& s : logprobs) {
    ordered_json e = entry(s.token, s.sampled.logprob);
    ordered_json top = ordered_json::array();
    for (size_t i = 0; i < s.top.size() && (num_top < 0 || static_cast<int64_t>(i) < num_top);
         ++i) {
      top.push_back(entry(s.top[i].token, s.top[i].logprob));
    }
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return content;
}

ordered_json Envelope(const std::string& id, const char* object, int64_t created,
                      const std::string& model) {
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

std::string Dump(const ordered_json& value) {
  return value.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string SseEvent(const ordered_json& value) { return "data: " + Dump(value) + "\n\n"; }

}  // namespace moeserve::server
