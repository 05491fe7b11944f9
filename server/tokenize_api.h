// vLLM's /tokenize and /detokenize (docs/spec/serving.md §7) as JSON in, JSON out, without HTTP:
// the handlers (http_server.cc) send the answer, or the error mapped by ToApiError. The same checks
// as a generation request's apply where they can: the model name, chat messages' content parts, and
// a text refused unencoded when it cannot fit max_model_len tokens.
#pragma once

#include "core/status.h"
#include "server/openai_json.h"
#include "server/request_check.h"

namespace moeserve::server {

// POST /tokenize: {"prompt": text} or {"messages": [...]} (rendered by the chat template, with
// "tools" and "add_generation_prompt"), "add_special_tokens" (default: true for a prompt, false
// for messages), "return_token_strs", "model" -> {"count", "max_model_len", "tokens"[,
// "token_strs"]}. Messages are read and rendered as a chat completion's are (tools, the template's
// kwargs, reasoning_effort, earlier calls' arguments), so the ids are the prompt a chat request
// would run; body_text keeps the tools' key order. Errors: InvalidArgument naming the field;
// NotFound for an unknown model.
Result<ordered_json> TokenizeResponse(const RequestContext& ctx, const json& body,
                                      std::string_view body_text = {});

// POST /detokenize: {"tokens": [ids]} -> {"prompt": text}; an id outside the tokenizer's range
// is an InvalidArgument naming "tokens".
Result<ordered_json> DetokenizeResponse(const RequestContext& ctx, const json& body);

}  // namespace moeserve::server
