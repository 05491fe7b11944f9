// The BPE model of tokenizer.json over the byte-level alphabet: a word's bytes start as one symbol
// each (the vocabulary entry of the byte's code point, byte_level.h) and adjacent symbols are
// merged lowest merge rank first, leftmost first among equal ranks — Hugging Face's
// Word::merge_all, so results match it exactly. Results are cached per word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moeserve::tokenizer {

struct BpeConfig {
  // token (in the byte-level alphabet) -> id
  std::vector<std::pair<std::string, int32_t>> vocab;
  // In rank order.
  std::vector<std::pair<std::string, std::string>> merges;
  std::optional<std::string> unk_token;  // bytes without a vocabulary entry become this token
  bool fuse_unk = false;                 // one unk token for a run of unknown bytes
  bool ignore_merges = false;            // a word that is a token of its own is not merged
  size_t cache_capacity = 1 << 16;       // words whose ids are kept; 0 turns the cache off
};

class BpeModel {
 public:
  // Fails on duplicate tokens or ids, negative ids, merges naming tokens outside the vocabulary,
  // merge results missing from it, and an unk_token outside it.
  static Result<std::unique_ptr<BpeModel>> Create(BpeConfig config);
  ~BpeModel();

  // Appends the ids of one pre-tokenized word given as raw bytes. Bytes whose token is missing
  // from the vocabulary are dropped, or become unk_token when there is one (as in Hugging Face).
  // Thread-safe.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token of `id` (byte-level form); nullopt when no token has it.
  std::optional<std::string_view> IdToToken(int32_t id) const;
  // One past the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t size() const { return size_; }

  // Empties the word cache (for benchmarks of the uncached path). Thread-safe.
  void ClearCache() const;

 private:
  struct Cache;
  struct MergeTable;
  BpeModel();

  void Merge(std::string_view word, std::vector<int32_t>* ids) const;

  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  size_t size_ = 0;
  struct TokenIndex;
  std::unique_ptr<TokenIndex> token_to_id_;
  std::unique_ptr<MergeTable> merges_;
  int32_t byte_ids_[256];  // the id of each byte's one-character token, -1 when there is none
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::unique_ptr<Cache> cache_;
};

}  // namespace moeserve::tokenizer
