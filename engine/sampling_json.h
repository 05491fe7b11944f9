// vLLM's sampling parameters read from JSON -- an HTTP request body (the server) or a `generate
// --prompts-file` line -- one key at a time, by vLLM's names (docs/spec/serving.md §3.1). Only
// types are checked here; ranges are SamplingParams::Validate's, whose messages name the parameter
// too.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string_view>

#include "core/status.h"
#include "engine/sampling_params.h"

namespace moeserve::engine {

// Sets the field of `p` that `key` names from `value`. *known is false when `key` is not a
// sampling parameter (p untouched, OK returned): the caller decides what else it may be.
//
// null means "not given": p keeps what it holds (the caller's defaults), as vLLM's OpenAI server
// reads a null field. A wrong type is an InvalidArgument naming the key ("\"top_k\" must be an
// integer"). Integer fields take JSON integers only (2.0 is an error); number fields take both.
// Beyond the plain fields: "seed" -1 means none; "stop" is a string or a list of strings;
// "logit_bias" is an object {"token id": bias}. Structured output comes from any of
// "structured_outputs", "response_format", "guided_json", "guided_regex", "guided_choice",
// "guided_grammar" (vLLM's and OpenAI's spellings); each replaces what p held.
Status ApplySamplingKey(std::string_view key, const nlohmann::json& value,
                        engine::SamplingParams& p, bool* known);

// A request object (a body, a prompts-file line) may ask for structured output by one key only:
// an InvalidArgument naming two that do ({"type": "text"} formats ask for nothing).
Status CheckOneStructuredOutput(const nlohmann::json& object);

// A JSON Schema read from a parsed object has its keys sorted (nlohmann::json); JSON Schema
// properties are written in the schema's order. Given the object's text, p's schema becomes the
// schema as written there.
void KeepSchemaOrder(std::string_view object_text, SamplingParams& p);

// The keys ApplySamplingKey knows, in SamplingParams' order (for messages and --help).
std::span<const std::string_view> SamplingKeys();

}  // namespace moeserve::engine
