#include "core/json.h"

#include <algorithm>

namespace moeserve {

int JsonNestingDepth(std::string_view text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        deepest = std::max(deepest, ++depth);
        break;
      case ']':
      case '}':
        // Unbalanced closers make the text invalid; the parser says so. Never go below 0, so
        // "]]]][[[[" cannot hide depth.
        depth = std::max(depth - 1, 0);
        break;
      default:
        break;
    }
  }
  return deepest;
}

namespace {

Status Named(std::string_view what, Status s) {
  return what.empty() ? s : s.WithContext(std::string(what));
}

}  // namespace

Status CheckJsonDepth(std::string_view text, std::string_view what, int limit) {
  const int depth = JsonNestingDepth(text);
  if (depth > limit) {
    return Named(what, InvalidArgument("nests deeper than {} levels (found {})", limit, depth));
  }
  return OkStatus();
}

Status NotValidJson(std::string_view what, std::string_view detail) {
  return Named(what, InvalidArgument("not valid JSON: {}", detail));
}

namespace {

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipSpace(std::string_view t, size_t i) {
  while (i < t.size() && IsJsonSpace(t[i])) ++i;
  return i;
}

// One past the string starting at t[i] == '"'.
size_t SkipString(std::string_view t, size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\') {
      ++i;
    } else if (t[i] == '"') {
      return i + 1;
    }
  }
  return t.size();
}

// One past the value starting at t[i].
size_t SkipValue(std::string_view t, size_t i) {
  if (i >= t.size()) return i;
  if (t[i] == '"') return SkipString(t, i);
  if (t[i] != '{' && t[i] != '[') {
    while (i < t.size() && !IsJsonSpace(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']') ++i;
    return i;
  }
  int depth = 0;
  while (i < t.size()) {
    const char c = t[i];
    if (c == '"') {
      i = SkipString(t, i);
      continue;
    }
    if (c == '{' || c == '[') ++depth;
    if ((c == '}' || c == ']') && --depth == 0) return i + 1;
    ++i;
  }
  return i;
}

// The value of `key` in the object text `object` (the last one when given twice).
std::optional<std::string_view> Member(std::string_view object, std::string_view key) {
  size_t i = SkipSpace(object, 0);
  if (i >= object.size() || object[i] != '{') return std::nullopt;
  std::optional<std::string_view> found;
  for (i = SkipSpace(object, i + 1); i < object.size() && object[i] == '"';) {
    const size_t key_end = SkipString(object, i);
    const std::string_view raw = object.substr(i, key_end - i);
    bool same = raw.size() >= 2 && raw.substr(1, raw.size() - 2) == key;
    if (!same && raw.find('\\') != std::string_view::npos) {  // an escaped spelling
      const nlohmann::json decoded = nlohmann::json::parse(raw, nullptr, false);
      same = decoded.is_string() && decoded.get_ref<const std::string&>() == key;
    }
    i = SkipSpace(object, key_end);
    if (i >= object.size() || object[i] != ':') return std::nullopt;
    const size_t value = SkipSpace(object, i + 1);
    const size_t value_end = SkipValue(object, value);
    if (same) found = object.substr(value, value_end - value);
    i = SkipSpace(object, value_end);
    if (i < object.size() && object[i] == ',') i = SkipSpace(object, i + 1);
  }
  return found;
}

}  // namespace

std::optional<std::string_view> RawJsonMember(std::string_view text,
                                              std::initializer_list<std::string_view> path) {
  std::optional<std::string_view> at = text;
  for (std::string_view key : path) {
    at = Member(*at, key);
    if (!at) return std::nullopt;
  }
  return at;
}

}  // namespace moeserve
