// Structured output, enforced token by token: a compiled grammar (immutable, shared by every
// request with the same spec and tokenizer) and a matcher per request.
//
//   auto vocab = Vocabulary::FromTokenizer(tok, {eos ids});          // once per tokenizer
//   auto g = Compile(spec, vocab);                                  // structured.h; cacheable
//   Matcher m(*g);
//   each step:  m.FillNextTokenBitmask(mask);   // bit id set: token id may come next
//               ... sample with the mask ...
//               m.AcceptToken(id);              // false (and no change) if the mask refused it
//   speculative decoding: AcceptToken each draft token; Rollback(k) takes the last k back
//   EOS: allowed exactly when CanEnd(); accepting it makes IsFinished().
//
// How a mask is made (the design of docs/structured.md): the vocabulary's byte trie is walked with
// the automaton, backing out of every subtree the grammar refuses. The walk from one automaton
// state with an unknown caller is the same for every request and every step: CompiledGrammar
// caches it per state (the tokens it accepts, and the trie nodes where the state's rule returns
// to its caller), filled on first use. A step then ORs the cached masks of its threads' states
// and walks only the subtrees after those returns against the live stack.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "structured/automaton.h"
#include "structured/pda_walk.h"
#include "structured/vocabulary.h"

namespace moeserve::structured {

class CompiledGrammar {
 public:
  CompiledGrammar(Automaton automaton, std::shared_ptr<const Vocabulary> vocabulary);

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  const std::shared_ptr<const Vocabulary>& vocabulary_ptr() const { return vocabulary_; }

  // What state `state` reads on its own, its caller unknown.
  struct StateMask {
    std::vector<uint32_t> bits;   // the accepted tokens as a mask, when many...
    std::vector<int32_t> tokens;  // ...or as a list, when few (bits empty)
    std::vector<int32_t> exits;   // trie nodes (with children) where the rule returned...
    bool rest_trie = false;       // ...in the vocabulary's rest_trie() (else its trie())
    bool overflowed = false;      // the walk hit a bound of pda_walk.h: the grammar is refused
  };
  // Computed on first use, then cached and shared while the cache holds less than
  // kMaxMaskCacheBytes (past that, computed each time: a grammar cannot grow memory without
  // bound); thread-safe.
  std::shared_ptr<const StateMask> MaskOf(int32_t state) const;
  static constexpr size_t kMaxMaskCacheBytes = size_t{64} << 20;
  // The same mask by a walk of the whole trie, never cached (the scalar twin of MaskOf's text
  // shortcut, for tests).
  StateMask MaskByFullWalk(int32_t state) const;
  // States whose mask is cached (for benchmarks and tests).
  size_t cached_states() const;
  // Bytes held: the automaton's tables and the masks cached so far.
  size_t memory_bytes() const;

 private:
  // What state reads as one text character (Vocabulary's text tokens), memoized:
  static constexpr int32_t kTextUnknown = -3;  // not computed yet
  static constexpr int32_t kTextMixed = -2;    // not every text character alike
  static constexpr int32_t kTextNone = -1;     // no text character
  // (>= 0: every text character leads to that state, through states that only read bytes)
  int32_t TextStep(int32_t state) const;
  // The text characters a text token may have from `state`: 0..kMaxTextChars, or -1 when they
  // are not all alike there (the mask needs the whole trie).
  int TextCharsAllowed(int32_t state) const;

  Automaton automaton_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  mutable std::unique_ptr<std::atomic<int32_t>[]> text_step_;  // per state
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const StateMask>> cache_;
  mutable size_t cache_bytes_ = 0;
};

class Matcher {
 public:
  // Shares `grammar`. A Matcher is a value: a copy continues independently (n > 1 choices that
  // share a prompt, a fork for speculative drafts).
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Sets mask (vocabulary().mask_words() words; a shorter mask is left all zeros) to the tokens
  // that may come next: bit id % 32 of word id / 32. End-of-sequence ids are set when CanEnd().
  void FillNextTokenBitmask(std::span<uint32_t> mask);
  // Reads token id; false (state unchanged) when the grammar refuses it.
  bool AcceptToken(int32_t id);
  // Reads raw bytes as if they were one token (tests, forced prefixes).
  bool AcceptBytes(std::string_view bytes);
  // Takes back the last n accepted tokens; false (nothing done) if fewer were accepted.
  bool Rollback(int n);
  // The input so far is a complete sentence of the grammar: EOS is allowed.
  bool CanEnd() const;
  // EOS was accepted.
  bool IsFinished() const;
  // The grammar proved too ambiguous: a parser set or a step's work passed the bounds of
  // pda_walk.h. Sticky: from then on masks are empty (not even EOS) and AcceptToken refuses; the
  // request must end with an error ("grammar too ambiguous").
  bool overflowed() const { return arena_.overflowed; }
  // Tokens accepted and not rolled back.
  int num_tokens() const { return static_cast<int>(steps_.size()) - 1; }

 private:
  struct Step {
    size_t begin, end;  // the set in arena_.threads
    size_t frames;      // arena_.frames size after it
    bool can_end;
    bool finished;
  };
  std::shared_ptr<const CompiledGrammar> grammar_;
  internal::Arena arena_;
  std::vector<Step> steps_;  // steps_[0]: before any token
  std::vector<int32_t> seen_states_;
};

}  // namespace moeserve::structured
