// Tool calls in the model's own format as a grammar: how tool_choice "required" and a named
// function are enforced while decoding. The spec is JSON text:
//
//   {"format": "hermes" | "qwen3_xml", "parallel": true, "only": "NAME" | null,
//    "tools": [OpenAI tools: {"type": "function", "function": {"name", "parameters"}}]}
//
// hermes (Qwen3, Qwen3-Next):  <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//   ARGS: the tool's parameters schema as any JSON Schema (json_schema.h).
// qwen3_xml (Qwen3.5, Qwen3-Coder), as their templates write a call:
//   <tool_call>\n<function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//   parameters in the schema's order, the required ones always, the others optional; VALUE of a
//   string parameter: one of its enum, else text without "</" (a string's other constraints are
//   not enforced: the text has no quotes to put them inside); of any other type: JSON under the
//   parameter's schema.
// One call, or with "parallel" one or more separated by "\n"; "only": that tool alone.
// "opened": true -- the grammar of one call after its `<tool_call>` (tool_choice auto with
// "strict" tools: the grammar wakes when the model writes that token); a tool with "strict": true
// has its arguments under its schema, the others any JSON object (hermes) or any parameters
// (XML).
#pragma once

#include <string_view>

#include "core/status.h"
#include "structured/grammar.h"

namespace moeserve::structured {

Result<Grammar> ToolCallsGrammar(std::string_view spec_json, const Limits& limits = {});

}  // namespace moeserve::structured
