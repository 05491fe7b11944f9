// The OpenAI request and response bodies of /v1/completions and /v1/chat/completions as vLLM
// reads and writes them (docs/spec/serving.md §7): request JSON -> GenerationRequest (types
// checked, sampling keys through ApplySamplingKey), and the response, chunk, usage and logprobs
// shapes. No HTTP and no engine here: the handlers (http_server.cc) glue these to the engine loop.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "server/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

using nlohmann::json;
using nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChat };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when not given
  // Completions: the prompts (vLLM's batch form: a list of them), each as text or token ids.
  struct Prompt {
    std::optional<std::string> text;
    std::vector<int32_t> ids;  // when text is absent
  };
  std::vector<Prompt> prompts;
  bool echo = false;  // completions: the prompt goes before the output (text and logprobs)
  // Chat: the template's inputs, as JSON text.
  std::string messages_json;
  std::string tools_json = "null";
  bool add_generation_prompt = true;
  std::string chat_template_kwargs_json = "{}";
  // Chat's tools as the answer's parser reads them (null: the request has none), and how the
  // model may use them: tool_choice "none" | "auto" (the default) | "required" | a function
  // ({"type": "function", "function": {"name"}}: tool_choice_name), and parallel_tool_calls.
  std::shared_ptr<const std::vector<ToolSpec>> tools;
  enum class ToolChoice { kNone, kAuto, kRequired, kFunction };
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;
  bool parallel_tool_calls = true;
  // vLLM: true for completions (BOS where the tokenizer adds one), false for chat (the template
  // writes the special tokens).
  bool add_special_tokens = true;

  engine::SamplingParams params;
  bool max_tokens_given = false;  // chat's default is what is left of max_model_len
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // The request asked for prompt_logprobs (echo with logprobs needs them too, unasked).
  bool return_prompt_logprobs = false;
};

// Chat messages as the template gets them, as vLLM's chat_utils makes them for a template that
// takes string content: each message an object with a string "role"; a "content" list of parts
// becomes its text parts joined by "\n" (a bare string part counts as text), a null or missing
// one ""; parts of other types
// (image_url, input_audio, file, ...) are an InvalidArgument naming the type -- this server reads
// text only. An assistant message's tool_calls have their "arguments" JSON text parsed into an
// object (templates iterate it with |items; not JSON is an InvalidArgument naming the call), and
// its "reasoning" is also given as "reasoning_content" (the name Qwen's templates read).
// Returns the messages as the template's JSON text; arguments given as text are kept verbatim (keys
// in the client's order).
Result<std::string> ChatMessagesJson(const json& messages);

// Reads a request body (an object). Errors are InvalidArgument naming the field first, so that
// ToApiError finds the parameter.
// Keys the body does not give keep their `defaults`.
// body_text: the body as sent, for a JSON Schema's key order (engine::KeepSchemaOrder).
Result<GenerationRequest> ParseGenerationRequest(const json& body, Endpoint endpoint,
                                                 const engine::SamplingParams& defaults = {},
                                                 std::string_view body_text = {});

// A unique id: "cmpl-<32 hex>" / "chatcmpl-<32 hex>".
std::string NewRequestId(Endpoint endpoint);

// "stop" | "length" | "abort".
const char* FinishReasonJson(engine::FinishReason reason);

// OpenAI's usage object, with prompt_tokens_details.cached_tokens (the prefix cache's share).
ordered_json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

// Completions logprobs {"tokens", "token_logprobs", "top_logprobs", "text_offset"} of `tokens`,
// offsets counted from *text_offset (advanced past them: streaming calls it per delta).
ordered_json CompletionLogprobsJson(const tokenizer::Tokenizer& tok,
                                    const std::vector<engine::SampledToken>& logprobs,
                                    int64_t* text_offset);

// The prompt part of echoed completions logprobs: the same shape as CompletionLogprobsJson, the
// first token without a logprob (null), then one entry per prompt_logprobs element.
ordered_json EchoedPromptLogprobsJson(const tokenizer::Tokenizer& tok,
                                      const std::vector<int32_t>& prompt,
                                      const std::vector<engine::SampledToken>& prompt_logprobs,
                                      int64_t* text_offset);

// Appends completions logprobs `more` to `into` (both in CompletionLogprobsJson's shape).
void AppendCompletionLogprobs(ordered_json& into, const ordered_json& more);

// vLLM's prompt_logprobs: [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...],
// one dict per prompt token after the first, holding that token and the top ones.
ordered_json PromptLogprobsJson(const tokenizer::Tokenizer& tok,
                                const std::vector<engine::SampledToken>& prompt_logprobs);

// Chat logprobs entries [{"token", "logprob", "bytes", "top_logprobs": [...]}] (the "content"
// array), num_top of the top ones each (-1: all).
ordered_json ChatLogprobsContentJson(const tokenizer::Tokenizer& tok,
                                     const std::vector<engine::SampledToken>& logprobs,
                                     int64_t num_top);

// The envelope every response and chunk shares: id, object, created, model.
ordered_json Envelope(const std::string& id, const char* object, int64_t created,
                      const std::string& model);

// One JSON value as an SSE event, and the end of a stream.
std::string SseEvent(const ordered_json& value);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// JSON text that survives invalid UTF-8 (replaced by U+FFFD) in generated text.
std::string Dump(const ordered_json& value);

}  // namespace moeserve::server
