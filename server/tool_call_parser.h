// Tool calls in a chat answer's content (vLLM's --tool-call-parser hermes | qwen3_xml):
//
//   hermes     <tool_call>{"name": "NAME", "arguments": {...}}</tool_call>      Qwen3, Qwen3-Next
//   qwen3_xml  <tool_call><function=NAME><parameter=K>V</parameter>...</function></tool_call>
//              (alias qwen3_coder)                                  Qwen3.5, Qwen3-Coder
//
// ToolCallParser reads the content as it is produced, any number of bytes at a time, and decides
// each byte once, so the streamed deltas never depend on how the text was cut: a partial tag is
// held back until the next bytes settle it, never leaked as content. Per call:
//
//   1. the header (`<tool_call>` and the name: hermes up to `"arguments": `, XML up to
//      `<function=NAME>`) is held back. If it is malformed, names a tool the request does not
//      have, or the output ends inside it, the held text is content (vLLM leaves malformed calls
//      as content) and parsing goes on after it.
//   2. once the header is whole the call exists: its first delta carries index, id and name;
//      then the arguments stream as they are written. hermes: the model's JSON object verbatim,
//      byte by byte, each byte checked by a JSON syntax scanner; XML: a JSON object we write,
//      {"K": V, ...} with Python's separators, string values streamed (escaped) as they arrive
//      and other values converted by the tool's JSON-schema type when their `</parameter>` comes,
//      as vLLM's qwen3_coder parser converts them.
//   3. a call whose arguments turn malformed (or too deep, or too long) or that the output cuts
//      off stays a call: its arguments are what was streamed, which is then not valid JSON, and
//      `complete` is false. Streaming cannot take back a call it announced, and a non-streamed
//      answer must equal the streamed one; the bytes after the break, up to `</tool_call>`, are
//      dropped.
//   4. after the call, text up to `</tool_call>` is dropped; a new `<tool_call>` there also
//      starts the next call (a model that forgot the closing tag).
//
// Whitespace next to calls (before `<tool_call>`, after `</tool_call>`) is not content, so an
// answer of calls only has empty content (null in the API); when text follows a run of calls,
// the whitespace that stood before the run separates it from the text before ("A <call> B" ->
// "A B"). Other text before, between and after calls is content (vLLM's hermes drops text after
// the first call; we keep it). Cost: O(1) per byte plus the JSON work on one XML value at its end
// (bounded by ToolCallLimits); nothing is held that is not part of an unfinished tag, header or
// value. The text is the detokenizer's (valid UTF-8): the parsers split it only at ASCII bytes and
// pass other bytes through unchanged, so a complete call's arguments are valid JSON text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::server {

enum class ToolCallFormat { kNone, kHermes, kQwen3Xml };

// "hermes" | "qwen3_xml" | "qwen3_coder" (the same) | "none"; else InvalidArgument listing them.
Result<ToolCallFormat> ParseToolCallFormat(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);

// What the XML parser needs of a tool: its name and each parameter's JSON-schema type (vLLM's
// reading: "type" lower-cased, or the first non-null type of "anyOf" or of a type list; "string"
// when there is none), and whether the schema admits null.
struct ToolParam {
  std::string type = "string";
  bool allows_null = false;
};
struct ToolSpec {
  std::string name;
  std::map<std::string, ToolParam, std::less<>> params;  // parameters.properties
};

// The request's `tools` (OpenAI's [{"type": "function", "function": {"name", "parameters"}}]) as
// JSON text. Errors name the element: "tools[2].function.name: ...". At most kMaxTools tools and
// kMaxToolParams properties each.
inline constexpr size_t kMaxTools = 512;
inline constexpr size_t kMaxToolParams = 512;
Result<std::vector<ToolSpec>> ReadToolSpecs(std::string_view tools_json);

struct ToolCallLimits {
  size_t max_calls = 64;                // later `<tool_call>`s are content
  size_t max_argument_bytes = 1 << 20;  // one call's arguments text; past it the call breaks
  int max_argument_depth = 64;          // nesting of the arguments' arrays and objects
  size_t max_name_bytes = 256;          // a function or parameter name
  size_t max_header_bytes = 1024;       // `<tool_call>` up to the arguments
};

// One call's piece of a stream delta: the first carries id and name (and maybe arguments), later
// ones only arguments. OpenAI's delta.tool_calls[] element.
struct ToolCallDelta {
  size_t index = 0;
  std::string id;    // only on the first
  std::string name;  // only on the first
  std::string arguments;
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text when complete
  bool complete = false;  // the arguments closed and the call's body ended well-formed
};

// vLLM's tool call id: "chatcmpl-tool-" and 32 random hex digits.
std::string NewToolCallId();

// The JSON value (as text) of an XML parameter's text under its schema type, as vLLM converts
// it: strings stay; "null"/"None" (any case) are null for non-string types and nullable strings;
// integer types -> an integer, number types -> a number (an integral one printed as an integer),
// booleans -> `lower == "true"`; object and array types and unknown types -> the text parsed as
// JSON. Where a conversion fails the value stays a string (vLLM would also try Python's
// ast.literal_eval; we do not). `param` null: a parameter the schema does not name -> string.
std::string ConvertXmlParamValue(std::string_view text, const ToolParam* param, int max_depth);

class ToolCallParser {
 public:
  // `tools`: the request's (a call naming another tool is content); empty: any name is taken.
  // `new_id` makes each call's id (tests pass a counter).
  ToolCallParser(ToolCallFormat format, std::shared_ptr<const std::vector<ToolSpec>> tools,
                 ToolCallLimits limits = {}, std::function<std::string()> new_id = NewToolCallId);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  // Reads the next bytes of the content: appends the decided content to *content and the calls'
  // news to *calls (one element per call touched, in order).
  void Feed(std::string_view text, std::string* content, std::vector<ToolCallDelta>* calls);
  // The output ended: held text is content; a call still open stays incomplete.
  void Finish(std::string* content, std::vector<ToolCallDelta>* calls);

  // The calls so far (their arguments as streamed).
  const std::vector<ToolCall>& calls() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace moeserve::server
