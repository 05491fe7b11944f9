// A tokenizer's vocabulary as the matcher sees it: each token id's bytes, laid out as a byte
// trie in preorder so a mask walk visits the tokens sharing a prefix once, and skips a whole
// subtree when the grammar refuses the prefix.
//
//   nodes[i]   byte        the byte that leads from the parent to node i (root: none)
//              depth       bytes from the root (root: 0)
//              end         one past the last node of i's subtree (preorder)
//              tokens      token ids whose bytes are exactly node i's path
//
// Text tokens (most of a vocabulary: words, word pieces, CJK) are runs of whole UTF-8 characters
// that a JSON string holds unescaped. From a state that reads every such character alike (a
// string's body), which of them are allowed depends only on their length in characters: a mask
// walk takes them from text_up_to(n) and walks only the rest, in a second trie without them.
//
// Built once per tokenizer, immutable, shared by every compiled grammar over that tokenizer.
// Special (control) tokens are not in the trie: a grammar never allows them; the end-of-sequence
// ids are allowed where the grammar can end.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve::tokenizer {
class Tokenizer;
}

namespace moeserve::structured {

class Vocabulary {
 public:
  // Longer tokens are never allowed (Qwen3's longest has 256 bytes); it bounds the walk's depth.
  static constexpr size_t kMaxTokenBytes = 1024;

  // A text character: U+0020..U+10FFFF but '"' and '\' (surrogates have no UTF-8 form).
  // Longer text tokens are left in the rest trie (few: runs of spaces or dashes).
  static constexpr int kMaxTextChars = 32;

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;
    int32_t end = 0;
    int32_t token_begin = 0;  // Trie::token_ids[token_begin, token_end)
    int32_t token_end = 0;
  };
  struct Trie {
    std::vector<Node> nodes;
    std::vector<int32_t> token_ids;
    int max_depth = 0;
    std::span<const int32_t> tokens_at(const Node& n) const {
      return {token_ids.data() + n.token_begin, size_t(n.token_end - n.token_begin)};
    }
  };

  // token_bytes[id]: the bytes of token id (empty: never allowed, as special tokens).
  // eos_ids: the ids that end generation, allowed where the grammar can end.
  static Result<std::shared_ptr<const Vocabulary>> Create(std::vector<std::string> token_bytes,
                                                          std::vector<int32_t> eos_ids);
  // Every token of `tok` (special ones left out), with the given end-of-sequence ids.
  static Result<std::shared_ptr<const Vocabulary>> FromTokenizer(const tokenizer::Tokenizer& tok,
                                                                 std::vector<int32_t> eos_ids);

  // One past the largest token id: the mask has this many bits.
  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  // 32-bit words of a mask: (size() + 31) / 32.
  size_t mask_words() const { return (token_bytes_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return token_bytes_[id]; }
  bool is_eos(int32_t id) const;
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }

  // Every token that may be allowed.
  const Trie& trie() const { return trie_; }
  // Every such token but the text tokens of 1..kMaxTextChars characters.
  const Trie& rest_trie() const { return rest_trie_; }
  // The mask of the text tokens of 1..chars characters (0 <= chars <= kMaxTextChars).
  std::span<const uint32_t> text_up_to(int chars) const {
    return {text_up_to_.data() + size_t(chars) * mask_words(), mask_words()};
  }

 private:
  Vocabulary() = default;
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> eos_ids_;
  Trie trie_;
  Trie rest_trie_;
  std::vector<uint32_t> text_up_to_;  // [kMaxTextChars + 1][mask_words()]
};

}  // namespace moeserve::structured
