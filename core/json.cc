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

}  // namespace moeserve
