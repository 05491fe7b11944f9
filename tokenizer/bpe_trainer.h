// Trains a byte-level BPE vocabulary on a text, for the tokenizers make-model writes.
//
// Words are split off the text as the Qwen2/Qwen3 pre-tokenizer would split them (letters with an
// optional leading non-letter, single digits, punctuation runs with an optional leading space,
// whitespace runs), so that no merge crosses a word boundary. Merges are chosen by pair
// frequency, ties broken by the lexicographically smallest pair (deterministic), and only pairs
// seen at least twice are merged.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::tokenizer {

struct BpeVocab {
  // id -> token, in the byte-level alphabet (byte_level.h). Ids 0..255 are the single bytes in
  // byte order; id 256 + i is the result of merges[i].
  std::vector<std::string> tokens;
  // In rank order; each side is a token of `tokens` with a lower id than the merge result.
  std::vector<std::pair<std::string, std::string>> merges;
};

// Learns at most max_vocab - 256 merges (fewer when the text runs out of pairs seen twice).
// max_vocab must be at least 256.
BpeVocab TrainByteLevelBpe(std::string_view text, size_t max_vocab);

}  // namespace moeserve::tokenizer
