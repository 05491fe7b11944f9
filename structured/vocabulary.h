// A tokenizer's vocabulary as the matcher sees it: each token id's bytes, laid out as a byte
// trie in preorder so a mask walk visits the tokens sharing a prefix once, and skips a whole
// subtree when the grammar refuses the prefix.
//
//   nodes[i]   byte        the byte that leads from the parent to node i (root: none)
//              depth       bytes from the root (root: 0)
//              end         one past the last node of i's subtree (preorder)
//              tokens      token ids whose bytes are exactly node i's path
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

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;
    int32_t end = 0;
    int32_t token_begin = 0;  // token_ids_[token_begin, token_end)
    int32_t token_end = 0;
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

  const std::vector<Node>& nodes() const { return nodes_; }
  std::span<const int32_t> tokens_at(const Node& n) const {
    return {token_ids_.data() + n.token_begin, size_t(n.token_end - n.token_begin)};
  }
  int max_depth() const { return max_depth_; }

 private:
  Vocabulary() = default;
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> eos_ids_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  int max_depth_ = 0;
};

}  // namespace moeserve::structured
