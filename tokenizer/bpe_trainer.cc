#include "tokenizer/bpe_trainer.h"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/check.h"
#include "tokenizer/byte_level.h"

namespace moeserve::tokenizer {
namespace {

// ---- Pre-tokenization -------------------------------------------------------------------------
//
// A byte scanner for the Qwen2/Qwen3 split regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// tried alternative by alternative at each position, like the regex engine does. It only has to
// keep merges inside the words the real pre-tokenizer produces, so Unicode classes are
// approximated: every byte >= 0x80 counts as a letter (non-ASCII letters, digits, spaces and
// punctuation all stay in letter runs), and only ASCII digits and whitespace are recognized. On
// ASCII text the split is exact (compared with Hugging Face tokenizers 0.23.2 on prose and on
// random ASCII soup).

bool IsLetter(uint8_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsSpace(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool IsNewline(uint8_t c) { return c == '\r' || c == '\n'; }
bool IsOther(uint8_t c) { return !IsLetter(c) && !IsDigit(c) && !IsSpace(c); }

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// Length of the contraction ('s, 't, 're, 've, 'm, 'll, 'd, any case) at text[i], or 0.
size_t ContractionLength(std::string_view text, size_t i) {
  if (text[i] != '\'') return 0;
  for (const std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
    if (text.size() - i - 1 < suffix.size()) continue;
    bool match = true;
    for (size_t k = 0; k < suffix.size(); ++k) match &= Lower(text[i + 1 + k]) == suffix[k];
    if (match) return 1 + suffix.size();
  }
  return 0;
}

// Length of the word starting at text[i] (i < text.size()); always at least 1.
size_t WordLength(std::string_view text, size_t i) {
  const size_t n = text.size();
  auto at = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  auto skip = [&](size_t k, bool (*in_class)(uint8_t)) {
    while (k < n && in_class(at(k))) ++k;
    return k;
  };

  if (const size_t len = ContractionLength(text, i); len > 0) return len;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (IsLetter(at(i))) return skip(i, IsLetter) - i;
  if (!IsNewline(at(i)) && !IsDigit(at(i)) && i + 1 < n && IsLetter(at(i + 1))) {
    return skip(i + 1, IsLetter) - i;
  }
  // \p{N}: digits stay single, so numbers are never merged.
  if (IsDigit(at(i))) return 1;
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t punct_start = (at(i) == ' ' && i + 1 < n && IsOther(at(i + 1))) ? i + 1 : i;
  if (IsOther(at(punct_start))) return skip(skip(punct_start, IsOther), IsNewline) - i;
  // Only whitespace is left. \s*[\r\n]+ : the run up to and including its last newline.
  const size_t run_end = skip(i, IsSpace);
  for (size_t k = run_end; k > i; --k) {
    if (IsNewline(at(k - 1))) return k - i;
  }
  // \s+(?!\S) leaves the last space of a run for the next word (" word"); \s+ takes a single one.
  if (run_end < n && run_end - i > 1) return run_end - 1 - i;
  return run_end - i;
}

// ---- Merging -----------------------------------------------------------------------------------

using TokenId = int32_t;
using PairKey = uint64_t;

PairKey MakeKey(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}
TokenId Left(PairKey key) { return static_cast<TokenId>(key >> 32); }
TokenId Right(PairKey key) { return static_cast<TokenId>(key & 0xFFFFFFFFu); }

struct Word {
  std::vector<TokenId> symbols;
  int64_t count;
};

// A pair's count as it was when the entry was pushed. Counts only go down lazily: an entry may be
// stale (higher than the true count) and is then re-pushed with the true count when popped.
struct HeapEntry {
  int64_t count;
  PairKey pair;
};

class Trainer {
 public:
  explicit Trainer(std::string_view text) {
    for (int b = 0; b < 256; ++b) AddToken(BytesToByteLevel(std::string(1, static_cast<char>(b))));
    CountWords(text);
  }

  BpeVocab Train(size_t max_merges) {
    for (size_t w = 0; w < words_.size(); ++w) UpdatePairs(w, +1, nullptr);
    for (const auto& [pair, count] : pair_counts_) heap_.push({count, pair});

    while (vocab_.merges.size() < max_merges && !heap_.empty()) {
      const HeapEntry top = heap_.top();
      heap_.pop();
      const auto it = pair_counts_.find(top.pair);
      const int64_t count = it == pair_counts_.end() ? 0 : it->second;
      if (count != top.count) {
        if (count > 0) heap_.push({count, top.pair});
        continue;
      }
      // The top entry is exact and every other pair's true count is at most its entry's count,
      // so this is the most frequent pair (ties resolved by HeapLess).
      if (count < 2) break;
      std::string merged = vocab_.tokens[Left(top.pair)] + vocab_.tokens[Right(top.pair)];
      // Another pair cannot spell an existing token ("a"+"bc" after "ab"+"c"): both ends of an
      // occurrence of the string stay token boundaries until it is merged, so its inside evolves
      // as if it stood alone, the same way in every word, and the earlier merge took them all.
      CHECK(!token_set_.contains(merged)) << merged;
      Merge(top.pair, std::move(merged));
    }
    return std::move(vocab_);
  }

 private:
  // Orders the heap: the highest count on top, ties going to the lexicographically smallest
  // (left, right) pair of token strings, which makes training independent of hash order.
  struct HeapLess {
    const std::vector<std::string>* tokens;
    bool operator()(const HeapEntry& a, const HeapEntry& b) const {
      if (a.count != b.count) return a.count < b.count;
      const std::string& a_left = (*tokens)[Left(a.pair)];
      const std::string& b_left = (*tokens)[Left(b.pair)];
      if (a_left != b_left) return a_left > b_left;
      return (*tokens)[Right(a.pair)] > (*tokens)[Right(b.pair)];
    }
  };

  TokenId AddToken(std::string token) {
    const auto id = static_cast<TokenId>(vocab_.tokens.size());
    token_set_.insert(token);
    vocab_.tokens.push_back(std::move(token));
    return id;
  }

  void CountWords(std::string_view text) {
    std::unordered_map<std::string_view, int64_t> counts;
    for (size_t i = 0; i < text.size();) {
      const size_t len = WordLength(text, i);
      ++counts[text.substr(i, len)];
      i += len;
    }
    // Sorted so that word indices (and with them all iteration orders) depend on the text only.
    std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
    std::sort(sorted.begin(), sorted.end());
    words_.reserve(sorted.size());
    for (const auto& [word, count] : sorted) {
      Word& w = words_.emplace_back();
      w.count = count;
      w.symbols.reserve(word.size());
      for (const char c : word) w.symbols.push_back(static_cast<uint8_t>(c));
    }
  }

  // Adds (sign +1) or removes (sign -1) the pairs of word w to the counts, recording the changes
  // in *delta when given.
  void UpdatePairs(size_t w, int sign, std::unordered_map<PairKey, int64_t>* delta) {
    const Word& word = words_[w];
    for (size_t k = 0; k + 1 < word.symbols.size(); ++k) {
      const PairKey key = MakeKey(word.symbols[k], word.symbols[k + 1]);
      pair_counts_[key] += sign * word.count;
      if (delta != nullptr) (*delta)[key] += sign * word.count;
      if (sign > 0) where_[key].insert(w);
    }
  }

  void Merge(PairKey pair, std::string merged) {
    const TokenId left = Left(pair);
    const TokenId right = Right(pair);
    vocab_.merges.emplace_back(vocab_.tokens[left], vocab_.tokens[right]);
    const TokenId merged_id = AddToken(std::move(merged));

    // Words are rescanned whole (remove all their pairs, merge, add them back) rather than patched
    // around each occurrence, which keeps overlapping occurrences ("a a a") simple to get right.
    std::unordered_map<PairKey, int64_t> delta;
    const auto where_it = where_.find(pair);
    CHECK(where_it != where_.end());
    const std::unordered_set<size_t> affected = std::move(where_it->second);
    where_.erase(where_it);
    for (const size_t w : affected) {
      std::vector<TokenId>& symbols = words_[w].symbols;
      // `where_` is not pruned when a word loses a pair, so some words may no longer hold it.
      bool holds = false;
      for (size_t k = 0; k + 1 < symbols.size() && !holds; ++k) {
        holds = symbols[k] == left && symbols[k + 1] == right;
      }
      if (!holds) continue;
      UpdatePairs(w, -1, &delta);
      size_t out = 0;
      for (size_t k = 0; k < symbols.size(); ++k) {
        if (k + 1 < symbols.size() && symbols[k] == left && symbols[k + 1] == right) {
          symbols[out++] = merged_id;
          ++k;
        } else {
          symbols[out++] = symbols[k];
        }
      }
      symbols.resize(out);
      UpdatePairs(w, +1, &delta);
    }

    CHECK_EQ(pair_counts_[pair], 0);
    pair_counts_.erase(pair);
    for (const auto& [key, change] : delta) {
      const auto it = pair_counts_.find(key);
      if (it == pair_counts_.end()) continue;
      if (it->second == 0) {
        pair_counts_.erase(it);
      } else if (change > 0) {
        // Decreases are caught lazily when the stale entry is popped; increases need an entry.
        heap_.push({it->second, key});
      }
    }
  }

  BpeVocab vocab_;
  std::unordered_set<std::string> token_set_;  // the strings of vocab_.tokens
  std::vector<Word> words_;
  std::unordered_map<PairKey, int64_t> pair_counts_;
  // The words each pair occurs (or occurred) in.
  std::unordered_map<PairKey, std::unordered_set<size_t>> where_;
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, HeapLess> heap_{HeapLess{&vocab_.tokens}};
};

}  // namespace

BpeVocab TrainByteLevelBpe(std::string_view text, size_t max_vocab) {
  CHECK_GE(max_vocab, 256u) << "a byte-level vocabulary needs all 256 byte tokens";
  return Trainer(text).Train(max_vocab - 256);
}

}  // namespace moeserve::tokenizer
