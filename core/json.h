// JSON parsing with a nesting limit. nlohmann::json parses iteratively, but dump(), copies,
// comparisons and every walk of ours recurse once per level: a 400 KB body of 200,000 nested
// "[" overflows the stack of whichever thread touches it next. Every JSON text moeserve reads
// (request bodies, config files, tokenizer files, --prompts-file lines, chat-template variables)
// goes through ParseJson, which refuses a text nested deeper than kMaxJsonDepth before the
// parser builds anything, so no later recursion can go deeper than that.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "core/status.h"

namespace moeserve {

// Arrays and objects nested inside each other, counting the outermost as 1. serde_json's limit;
// far above what any real request, config or tokenizer file uses (a tool's JSON schema: < 20).
inline constexpr int kMaxJsonDepth = 128;

// The deepest nesting of '[' / '{' outside strings, found in one pass without recursion. For
// valid JSON it is the value's depth; for invalid JSON the parser's error comes after.
int JsonNestingDepth(std::string_view text);

// OK, or "<what>: nests deeper than <limit> levels (found N)" (no "<what>: " when what is
// empty: the caller adds its own context).
Status CheckJsonDepth(std::string_view text, std::string_view what, int limit = kMaxJsonDepth);

// The text of the value at `path` (object keys, outermost first) inside valid JSON text, as it is
// written there (keys in their order: nlohmann::json sorts them), or nullopt when some key is
// missing or a value on the way is not an object. A key given twice: the last one, as the
// parser keeps. One pass, no recursion; for text ParseJson accepted.
std::optional<std::string_view> RawJsonMember(std::string_view text,
                                              std::initializer_list<std::string_view> path);

// InvalidArgument "<what>: not valid JSON: <detail>" (no "<what>: " when what is empty).
Status NotValidJson(std::string_view what, std::string_view detail);

// Parses text as JSON (nlohmann::json or ordered_json) after CheckJsonDepth. Errors name `what`
// as CheckJsonDepth's do: "<what>: not valid JSON: <parser's message>".
template <typename Json = nlohmann::json>
Result<Json> ParseJson(std::string_view text, std::string_view what, int limit = kMaxJsonDepth) {
  if (Status s = CheckJsonDepth(text, what, limit); !s.ok()) return s;
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return NotValidJson(what, e.what());
  }
}

}  // namespace moeserve
