#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace moeserve::tokenizer {
namespace {

bool EndsWithWordChar(std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t start;
  return IsWordChar(PreviousCodePoint(text, end, &start));
}

bool StartsWithWordChar(std::string_view text, size_t start) {
  if (start >= text.size()) return false;
  return IsWordChar(NextCodePoint(text, &start));
}

// Start of the whitespace run that ends at `end` (Hugging Face's `\s*$` on text[..end]).
size_t WhitespaceRunStart(std::string_view text, size_t end) {
  while (end > 0) {
    size_t start;
    if (!IsUnicodeWhiteSpace(PreviousCodePoint(text, end, &start))) break;
    end = start;
  }
  return end;
}

// End of the whitespace run that starts at `start` (`^\s*` on text[start..]).
size_t WhitespaceRunEnd(std::string_view text, size_t start) {
  while (start < text.size()) {
    size_t next = start;
    if (!IsUnicodeWhiteSpace(NextCodePoint(text, &next))) break;
    start = next;
  }
  return start;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens,
                                     const std::vector<std::string>& patterns)
    : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;
    first_byte_[static_cast<uint8_t>(pattern[0])] = true;
    int32_t node = 0;
    for (const char c : pattern) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0})),
            {byte, child});
        nodes_.emplace_back();  // after the insert: it may move nodes_
      }
      node = child;
    }
    // Two tokens with one pattern: the first keeps it (either is as good as the other).
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  const auto it =
      std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{0}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

int32_t AddedTokenMatcher::LongestAt(std::string_view text, size_t start, size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = start; i < text.size(); ++i) {
    node = Child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) {
      best = nodes_[node].token;
      *length = i + 1 - start;
    }
  }
  return best;
}

void AddedTokenMatcher::Split(
    std::string_view text,
    const std::function<void(std::string_view, const AddedToken*)>& on_piece) const {
  size_t emitted = 0;  // everything before this offset has been reported
  size_t search = 0;   // where the next match may start (the end of the last raw match)
  while (search < text.size()) {
    size_t start = search;
    while (start < text.size() && !first_byte_[static_cast<uint8_t>(text[start])]) ++start;
    if (start >= text.size()) break;
    size_t length = 0;
    const int32_t index = LongestAt(text, start, &length);
    if (index < 0) {
      search = start + 1;
      continue;
    }
    size_t stop = start + length;
    search = stop;
    const AddedToken& token = *tokens_[index];
    if (token.single_word && (EndsWithWordChar(text, start) || StartsWithWordChar(text, stop))) {
      continue;  // inside a word: not this token (the match is still consumed, as in HF)
    }
    // The whitespace before may already belong to the previous token (its rstrip).
    if (token.lstrip) start = std::max(WhitespaceRunStart(text, start), emitted);
    if (token.rstrip) stop = WhitespaceRunEnd(text, stop);
    if (emitted < start) on_piece(text.substr(emitted, start - emitted), nullptr);
    on_piece(text.substr(start, stop - start), &token);
    emitted = stop;
  }
  if (emitted < text.size()) on_piece(text.substr(emitted), nullptr);
}

}  // namespace moeserve::tokenizer
