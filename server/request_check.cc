#include "server/request_check.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/json.h"

namespace moeserve::server {
namespace {

// Token ids of a prompt, each checked against the model's vocabulary.
Result<std::vector<int32_t>> Encode(const RequestContext& ctx, const std::string& text,
                                    bool add_special_tokens) {
  Result<std::vector<int32_t>> ids = ctx.tok.Encode(text, add_special_tokens);
  if (!ids.ok()) return InvalidArgument("prompt: {}", ids.status().message());
  for (int32_t id : *ids) {
    if (id >= ctx.vocab_size) {
      return Internal("the tokenizer gives id {}, outside the model's vocabulary of {}", id,
                      ctx.vocab_size);
    }
  }
  return ids;
}

// Checks a prompt's ids against the vocabulary and vLLM's context-length limits.
std::optional<ApiError> CheckPrompt(const RequestContext& ctx, const std::vector<int32_t>& prompt,
                                    const engine::SamplingParams& params) {
  if (prompt.empty()) return ApiError{400, "the prompt is empty", "prompt"};
  for (int32_t id : prompt) {
    if (id >= ctx.vocab_size) {
      return ApiError{400,
                      fmt::format("prompt: token id {} is outside the vocabulary [0, {})", id,
                                  ctx.vocab_size),
                      "prompt"};
    }
  }
  // vLLM's messages.
  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t max_len = ctx.max_model_len;
  if (len >= max_len) {
    return ApiError{400,
                    fmt::format("This model's maximum context length is {} tokens. However, "
                                "your request has {} input tokens. Please reduce the length of "
                                "the input messages.",
                                max_len, len),
                    "input_tokens"};
  }
  if (len + params.max_tokens > max_len) {
    return ApiError{400,
                    fmt::format("'max_tokens' is too large: {}. This model's maximum context "
                                "length is {} tokens and your request has {} input tokens ({} > "
                                "{} - {}).",
                                params.max_tokens, max_len, len, params.max_tokens, max_len, len),
                    "max_tokens"};
  }
  return std::nullopt;
}

}  // namespace

Status CheckModel(const RequestContext& ctx, const std::string& model) {
  if (model.empty() || model == ctx.served_model_name) return OkStatus();
  return NotFound("The model `{}` does not exist.", model);
}

Result<std::string> RenderChat(const RequestContext& ctx, const tokenizer::ChatTemplateInputs& inputs) {
  if (ctx.chat_template == nullptr) {
    return InvalidArgument(
        "messages: the model has no chat template (tokenizer_config.json "
        "has none; pass --chat-template)");
  }
  Result<std::string> text = ctx.chat_template->Render(inputs);
  // A template's error (raise_exception included) is the request's fault, as vLLM's 400.
  if (!text.ok()) return InvalidArgument("messages: {}", text.status().message());
  return text;
}

Result<json> ParseRequestBody(std::string_view body) {
  ASSIGN_OR_RETURN(json parsed, ParseJson(body, "the request body"));
  if (!parsed.is_object()) return InvalidArgument("the request body must be a JSON object");
  return parsed;
}

std::optional<ApiError> CheckGenerationRequest(const RequestContext& ctx, const json& body,
                                               Endpoint endpoint, CheckedRequest* out) {
  Result<GenerationRequest> parsed = ParseGenerationRequest(body, endpoint, ctx.default_params);
  if (!parsed.ok()) return ToApiError(parsed.status());
  GenerationRequest& r = out->request;
  r = std::move(*parsed);
  if (Status s = CheckModel(ctx, r.model); !s.ok()) return ToApiError(s);
  if (endpoint == Endpoint::kChat) {
    Result<std::string> text = RenderChat(
        ctx, {r.messages_json, r.tools_json, r.add_generation_prompt, r.chat_template_kwargs_json});
    if (!text.ok()) return ToApiError(text.status());
    r.prompts.push_back({.text = std::move(*text), .ids = {}});
  }
  for (GenerationRequest::Prompt& p : r.prompts) {
    if (p.text) {
      Result<std::vector<int32_t>> ids = Encode(ctx, *p.text, r.add_special_tokens);
      if (!ids.ok()) return ToApiError(ids.status());
      out->prompts.push_back(std::move(*ids));
      out->prompt_texts.push_back(std::move(*p.text));
    } else {
      out->prompts.push_back(std::move(p.ids));
      out->prompt_texts.push_back(r.echo ? ctx.tok.Decode(out->prompts.back()) : "");
    }
  }
  // Chat's default max_tokens: what is left of the context (one prompt).
  if (endpoint == Endpoint::kChat && !r.max_tokens_given) {
    r.params.max_tokens = ctx.max_model_len - static_cast<int64_t>(out->prompts.front().size());
  }
  for (const std::vector<int32_t>& prompt : out->prompts) {
    if (std::optional<ApiError> e = CheckPrompt(ctx, prompt, r.params)) return e;
  }
  if (ctx.max_tokens_cap) r.params.max_tokens = std::min(r.params.max_tokens, *ctx.max_tokens_cap);
  if (!r.params.ignore_eos) {
    for (int32_t id : ctx.extra_eos_ids) {
      if (!std::count(r.params.stop_token_ids.begin(), r.params.stop_token_ids.end(), id)) {
        r.params.stop_token_ids.push_back(id);
      }
    }
  }
  for (const std::string& s : r.params.stop) {
    if (s.empty()) return ApiError{400, "stop: empty stop strings are not allowed", "stop"};
  }
  if (!r.params.bad_words.empty()) {
    if (Status s = engine::ResolveBadWords(r.params, ctx.tok); !s.ok()) return ToApiError(s);
  }
  if (Status s = r.params.Validate(ctx.vocab_size); !s.ok()) return ToApiError(s);
  return std::nullopt;
}

}  // namespace moeserve::server
