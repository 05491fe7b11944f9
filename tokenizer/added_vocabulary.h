// Added tokens (tokenizer.json "added_tokens"): matched in the text before normalization and
// pre-tokenization, as Hugging Face's AddedVocabulary does — leftmost-longest over all contents
// (its Aho-Corasick MatchKind::LeftmostLongest), then single_word, lstrip and rstrip applied to
// each match. Tokens with normalized = false are matched in the raw text, the others in the
// normalized pieces between those.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;  // match only where no word character touches either side
  bool lstrip = false;       // the token swallows the whitespace before it
  bool rstrip = false;       // ... and after it
  bool normalized = false;   // matched in the normalized text rather than the raw text
  bool special = false;      // skipped by decoding with skip_special_tokens
};

// Finds one group of added tokens (the raw or the normalized ones) in text.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // patterns[i] is what tokens[i] matches (its content, normalized for the normalized group).
  // Empty patterns never match. `tokens` must outlive the matcher.
  AddedTokenMatcher(std::vector<const AddedToken*> tokens,
                    const std::vector<std::string>& patterns);

  bool empty() const { return tokens_.empty(); }

  // Cuts `text` (valid UTF-8) into pieces covering it in order: on_piece(piece, token) with the
  // matched token (the piece then includes any whitespace it strips), or nullptr for the text
  // between matches. Empty pieces are not reported.
  void Split(std::string_view text,
             const std::function<void(std::string_view, const AddedToken*)>& on_piece) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node, sorted by byte
    int32_t token = -1;                                 // index into tokens_ when a pattern ends
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  // The longest pattern starting at text[start]: its token index and length, or -1.
  int32_t LongestAt(std::string_view text, size_t start, size_t* length) const;

  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

}  // namespace moeserve::tokenizer
