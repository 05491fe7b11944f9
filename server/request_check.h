// What a generation handler checks before a request reaches the engine, in one function so that
// the handlers and the request-body fuzzer run the same code: the body parsed as a JSON object
// (depth-limited), the OpenAI keys read, the model name, the chat rendered, the prompts encoded
// and checked against the vocabulary and max_model_len, the generation-config caps and stop ids
// applied, stop strings and bad words resolved, the sampling parameters validated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.h"
#include "server/api_error.h"
#include "server/openai_json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

// The cost bounds of one request, checked before the engine sees it: serve's flags, vLLM's names
// where vLLM has them. A request past one is refused with a 400 naming the flag.
struct RequestLimits {
  // --max-logprobs: logprobs (chat: top_logprobs) and prompt_logprobs at most this many. -1: the
  // whole vocabulary. As in vLLM, a request's -1 means the vocabulary's size, so it passes only
  // when this is -1 (or at least the vocabulary).
  int64_t max_logprobs = 20;
  // --max-choices-per-request: choices per request (prompts x n), each an engine request with
  // its own sampler, detokenizer and answer.
  int64_t max_choices = 64;
  // --max-stop-bytes: the bytes of a request's stop strings, summed (each choice's detokenizer
  // searches them at every token).
  int64_t max_stop_bytes = 16 << 10;
  // --max-response-mib: the most an answer may take, as EstimateResponseBytes reckons it.
  int64_t max_response_bytes = int64_t{256} << 20;
};

// What the checks need of the server: its model, tokenizer and limits.
struct RequestContext {
  const tokenizer::Tokenizer& tok;
  const tokenizer::ChatTemplate* chat_template;  // null: chat requests are refused (400)
  std::string_view served_model_name;
  int64_t vocab_size;
  int64_t max_model_len;
  const engine::SamplingParams& default_params;  // generation_config.json's, under the request's
  const std::vector<int32_t>& extra_eos_ids;     // join every request's stop ids unless ignore_eos
  std::optional<int64_t> max_tokens_cap;         // generation_config.json's max_new_tokens
  const RequestLimits& limits;
  // Tokens the engine's KV cache holds (EngineLayout: num_blocks * block_size): a request whose
  // choices need more at once -- each prompt + max_tokens -- could never run whole. 0: unknown,
  // not checked.
  int64_t kv_cache_tokens = 0;
};

// A request ready for the engine: its keys, and per prompt its ids and (for echo) its text.
struct CheckedRequest {
  GenerationRequest request;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
};

// "" or the served name; otherwise vLLM's NotFound (the name quoted up to 256 bytes).
Status CheckModel(const RequestContext& ctx, const std::string& model);

// A prompt's text before it is encoded: more bytes than max_model_len tokens can stand for
// (Tokenizer::max_bytes_per_token) is an InvalidArgument naming `what` (the field: "prompt",
// "messages") and --max-model-len. Constant time: a text that cannot fit is never encoded.
Status CheckTextLength(const RequestContext& ctx, std::string_view text, std::string_view what);

// The chat template over a request's messages; its errors are the request's (InvalidArgument).
Result<std::string> RenderChat(const RequestContext& ctx,
                               const tokenizer::ChatTemplateInputs& inputs);

// The request body (an object) as the JSON the handlers read, or a 400 naming the problem.
Result<json> ParseRequestBody(std::string_view body);

// Checks a parsed body; on success fills *out, otherwise returns vLLM's error. Every cost bound
// of ctx.limits is checked here, before a prompt is encoded where the bound does not need its
// tokens. body_text: the body as sent (a JSON Schema keeps its key order from it; empty: sorted).
std::optional<ApiError> CheckGenerationRequest(const RequestContext& ctx, const json& body,
                                               Endpoint endpoint, CheckedRequest* out,
                                               std::string_view body_text = {});

// The bytes a checked request's answer could take: the JSON of a non-streamed one (a stream's
// events also repeat an envelope per token, not counted). Per choice, max_tokens tokens of text
// and, with logprobs, (1 + logprobs) entries per token, plus its prompt's logprobs entries
// (completions repeat them per choice, chat sends them once); a token's text reckoned at 8
// bytes, a logprobs entry at 64 (chat's entry with its "bytes" list, for a token of 4 bytes).
int64_t EstimateResponseBytes(const RequestContext& ctx, const CheckedRequest& checked);

}  // namespace moeserve::server
