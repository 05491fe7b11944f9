#include "server/request_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>

#include "core/json.h"

namespace moeserve::server {
namespace {

// An unknown model's name is quoted back up to this many bytes.
constexpr size_t kMaxQuotedModelBytes = 256;
// EstimateResponseBytes' reckoning (request_check.h).
constexpr int64_t kTextBytesPerToken = 8;
constexpr int64_t kBytesPerLogprobEntry = 64;

// `s` cut to at most `max` bytes at a UTF-8 character's start, "..." marking the cut.
std::string Truncated(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return fmt::format("{}...", s.substr(0, end));
}

// How many logprobs a request's value asks for: -1 is the whole vocabulary, as in vLLM.
int64_t LogprobsAsked(int64_t value, int64_t vocab_size) {
  return value == -1 ? vocab_size : value;
}

// The bounds that need no token ids, checked before any prompt is encoded: choices, logprobs,
// stop strings, and the id lists against the vocabulary. (Values out of range -- n < 1,
// logprobs < -1 -- are left to SamplingParams::Validate's vLLM messages.)
std::optional<ApiError> CheckCostBeforeEncoding(const RequestContext& ctx,
                                                const GenerationRequest& r) {
  const RequestLimits& limits = ctx.limits;
  const engine::SamplingParams& p = r.params;
  const bool chat = r.endpoint == Endpoint::kChat;
  const int64_t num_prompts = chat ? 1 : static_cast<int64_t>(r.prompts.size());
  // In double: n is not validated yet, and prompts x n could overflow.
  const double choices =
      static_cast<double>(num_prompts) * static_cast<double>(std::max<int64_t>(p.n, 1));
  if (choices > static_cast<double>(limits.max_choices)) {
    return ApiError{400,
                    fmt::format("n: {} prompt(s) x n = {} make {:.0f} choices, more than the "
                                "server allows per request: {} (--max-choices-per-request)",
                                num_prompts, p.n, choices, limits.max_choices),
                    "n"};
  }
  const int64_t max_logprobs = limits.max_logprobs == -1 ? ctx.vocab_size : limits.max_logprobs;
  // vLLM's messages, with the flag.
  const auto too_many_logprobs = [&](const char* kind, int64_t asked, const char* param) {
    return ApiError{
        400,
        fmt::format("Requested {} logprobs of {}{}, which is greater than max "
                    "allowed: {} (--max-logprobs)",
                    kind, asked,
                    asked == -1 ? fmt::format(" (the whole vocabulary, {})", ctx.vocab_size) : "",
                    limits.max_logprobs),
        param};
  };
  if (p.logprobs && *p.logprobs >= -1 &&
      LogprobsAsked(*p.logprobs, ctx.vocab_size) > max_logprobs) {
    return too_many_logprobs("sample", *p.logprobs, chat ? "top_logprobs" : "logprobs");
  }
  if (p.prompt_logprobs && *p.prompt_logprobs >= -1 &&
      LogprobsAsked(*p.prompt_logprobs, ctx.vocab_size) > max_logprobs) {
    return too_many_logprobs("prompt", *p.prompt_logprobs, "prompt_logprobs");
  }
  int64_t stop_bytes = 0;
  for (const std::string& stop : p.stop) stop_bytes += static_cast<int64_t>(stop.size());
  if (stop_bytes > limits.max_stop_bytes) {
    return ApiError{400,
                    fmt::format("stop: the stop strings have {} bytes, more than the server "
                                "allows per request: {} (--max-stop-bytes)",
                                stop_bytes, limits.max_stop_bytes),
                    "stop"};
  }
  // Each list names tokens: more entries than the vocabulary has tokens can only repeat some.
  const auto too_long = [&](const char* param, size_t size) -> std::optional<ApiError> {
    if (static_cast<int64_t>(size) <= ctx.vocab_size) return std::nullopt;
    return ApiError{400,
                    fmt::format("{}: {} entries, more than the vocabulary's {} tokens", param, size,
                                ctx.vocab_size),
                    param};
  };
  if (auto e = too_long("logit_bias", p.logit_bias.size())) return e;
  if (auto e =
          too_long("allowed_token_ids", p.allowed_token_ids ? p.allowed_token_ids->size() : 0)) {
    return e;
  }
  if (auto e = too_long("stop_token_ids", p.stop_token_ids.size())) return e;
  return std::nullopt;
}

// The bounds that need the prompts' ids: the KV cache the choices hold at once, and the answer.
std::optional<ApiError> CheckCostAfterEncoding(const RequestContext& ctx,
                                               const CheckedRequest& checked) {
  const engine::SamplingParams& p = checked.request.params;
  const int64_t n = std::max<int64_t>(p.n, 1);
  if (ctx.kv_cache_tokens > 0) {
    int64_t tokens = 0;  // each choice holds prompt + max_tokens positions at most
    for (const std::vector<int32_t>& prompt : checked.prompts) {
      tokens += n * (static_cast<int64_t>(prompt.size()) + p.max_tokens);
    }
    if (tokens > ctx.kv_cache_tokens) {
      return ApiError{400,
                      fmt::format("max_tokens: the request's {} choice(s) need up to {} tokens of "
                                  "KV cache (prompt + max_tokens each), more than the server's "
                                  "cache holds: {} (--kv-cache-memory); lower n or max_tokens",
                                  n * static_cast<int64_t>(checked.prompts.size()), tokens,
                                  ctx.kv_cache_tokens),
                      "max_tokens"};
    }
  }
  const int64_t bytes = EstimateResponseBytes(ctx, checked);
  if (bytes > ctx.limits.max_response_bytes) {
    constexpr double kMiB = 1 << 20;
    return ApiError{400,
                    fmt::format("the answer could take {:.0f} MiB, more than the server allows: "
                                "{:.0f} MiB (--max-response-mib); lower n, max_tokens, logprobs "
                                "or prompt_logprobs",
                                bytes / kMiB, ctx.limits.max_response_bytes / kMiB),
                    ""};
  }
  return std::nullopt;
}

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
      return ApiError{
          400,
          fmt::format("prompt: token id {} is outside the vocabulary [0, {})", id, ctx.vocab_size),
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
  return NotFound("The model `{}` does not exist.", Truncated(model, kMaxQuotedModelBytes));
}

Status CheckTextLength(const RequestContext& ctx, std::string_view text, std::string_view what) {
  const int64_t per_token = static_cast<int64_t>(ctx.tok.max_bytes_per_token());
  if (per_token <= 0 || ctx.max_model_len <= 0) return OkStatus();
  const int64_t bytes = static_cast<int64_t>(text.size());
  if (bytes / per_token < ctx.max_model_len) return OkStatus();  // bytes < len * per_token
  return InvalidArgument(
      "{}: {} bytes are more than this model's maximum context length of {} tokens "
      "(--max-model-len) can hold, a token of its tokenizer standing for at most {} bytes. "
      "Please reduce the length of the input.",
      what, bytes, ctx.max_model_len, per_token);
}

Result<std::string> RenderChat(const RequestContext& ctx,
                               const tokenizer::ChatTemplateInputs& inputs) {
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
                                               Endpoint endpoint, CheckedRequest* out,
                                               std::string_view body_text) {
  Result<GenerationRequest> parsed =
      ParseGenerationRequest(body, endpoint, ctx.default_params, body_text);
  if (!parsed.ok()) return ToApiError(parsed.status());
  GenerationRequest& r = out->request;
  r = std::move(*parsed);
  if (Status s = CheckModel(ctx, r.model); !s.ok()) return ToApiError(s);
  if (std::optional<ApiError> e = CheckCostBeforeEncoding(ctx, r)) return e;
  if (endpoint == Endpoint::kChat) {
    Result<std::string> text = RenderChat(
        ctx, {r.messages_json, r.tools_json, r.add_generation_prompt, r.chat_template_kwargs_json});
    if (!text.ok()) return ToApiError(text.status());
    if (Status s = CheckTextLength(ctx, *text, "messages"); !s.ok()) return ToApiError(s);
    r.prompts.push_back({.text = std::move(*text), .ids = {}});
  }
  for (GenerationRequest::Prompt& p : r.prompts) {
    if (p.text) {
      if (endpoint == Endpoint::kCompletions) {
        if (Status s = CheckTextLength(ctx, *p.text, "prompt"); !s.ok()) return ToApiError(s);
      }
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
  return CheckCostAfterEncoding(ctx, *out);
}

int64_t EstimateResponseBytes(const RequestContext& ctx, const CheckedRequest& checked) {
  const GenerationRequest& r = checked.request;
  const engine::SamplingParams& p = r.params;
  const int64_t n = std::max<int64_t>(p.n, 1);
  // Entries per token: the token's own and the top ones.
  const auto entries = [&](const std::optional<int64_t>& asked) -> int64_t {
    return asked ? 1 + LogprobsAsked(std::max<int64_t>(*asked, 0), ctx.vocab_size) : 0;
  };
  const int64_t per_output_token = kTextBytesPerToken + entries(p.logprobs) * kBytesPerLogprobEntry;
  // Prompt logprobs go out when asked, and again as the echoed prompt's (echo with logprobs).
  const int64_t prompt_logprobs_copies =
      (r.return_prompt_logprobs ? 1 : 0) + (r.echo && p.logprobs ? 1 : 0);
  const int64_t per_prompt_token =
      prompt_logprobs_copies * entries(p.prompt_logprobs) * kBytesPerLogprobEntry +
      (r.echo ? kTextBytesPerToken : 0);
  const bool chat = r.endpoint == Endpoint::kChat;
  double bytes = 0;  // in double: no overflow, whatever the request
  for (const std::vector<int32_t>& prompt : checked.prompts) {
    const double len = static_cast<double>(prompt.size());
    bytes += static_cast<double>(n) * static_cast<double>(p.max_tokens) * per_output_token;
    bytes += (chat ? 1.0 : static_cast<double>(n)) * len * per_prompt_token;
  }
  return bytes >= 9e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

}  // namespace moeserve::server
