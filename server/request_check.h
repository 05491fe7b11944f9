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
};

// A request ready for the engine: its keys, and per prompt its ids and (for echo) its text.
struct CheckedRequest {
  GenerationRequest request;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
};

// "" or the served name; otherwise vLLM's NotFound.
Status CheckModel(const RequestContext& ctx, const std::string& model);

// The chat template over a request's messages; its errors are the request's (InvalidArgument).
Result<std::string> RenderChat(const RequestContext& ctx,
                               const tokenizer::ChatTemplateInputs& inputs);

// The request body (an object) as the JSON the handlers read, or a 400 naming the problem.
Result<json> ParseRequestBody(std::string_view body);

// Checks a parsed body; on success fills *out, otherwise returns vLLM's error.
std::optional<ApiError> CheckGenerationRequest(const RequestContext& ctx, const json& body,
                                               Endpoint endpoint, CheckedRequest* out);

}  // namespace moeserve::server
