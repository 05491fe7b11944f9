// Pre-tokenization of tokenizer.json: Split steps (a regex or literal pattern) followed by the
// ByteLevel step (optional leading space, optional GPT-2 regex split). Words come out as raw
// bytes; the byte-level alphabet mapping is left to the BPE model, which works on bytes.
//
// tokenizer.json regexes are written for Oniguruma (what Hugging Face's tokenizers compiles them
// with); they run here on PCRE2 with Unicode properties and JIT, with \s \S \w \W rewritten to
// Oniguruma's Unicode meaning (\s includes U+0085, \w includes marks) so both split alike.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::tokenizer {

class Regex {
 public:
  // literal = true matches `pattern` verbatim (tokenizer.json's {"String": ...} patterns).
  static Result<Regex> Compile(std::string_view pattern, bool literal);

  // Calls on_match(start, end) with the byte range of every non-empty match, left to right, in
  // valid UTF-8 `subject`. After an empty match the search resumes one character later, as
  // Oniguruma's iterator does. Fails only when PCRE2 gives up (resource limits).
  Status ForEachMatch(std::string_view subject,
                      const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const;

 private:
  struct Impl;
  explicit Regex(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable after Compile, so shared by copies and threads
};

// The pattern Hugging Face's ByteLevel pre-tokenizer splits with when use_regex is true (GPT-2's).
extern const char kGpt2SplitPattern[];
// The Split patterns of the model families' tokenizer.json, verbatim: Qwen2 and Qwen3 (also
// Qwen3-Next); Qwen3.5 (letter runs take combining marks too); Llama 3 (digits in runs of 3).
extern const char kQwen2SplitPattern[];
extern const char kQwen35SplitPattern[];
extern const char kLlama3SplitPattern[];

// Rewrites an Oniguruma pattern for PCRE2 (see the file comment). Exposed for tests.
std::string OnigurumaToPcre2(std::string_view pattern);

// How a Split step treats the matches of its pattern (after `invert`).
enum class SplitBehavior {
  kIsolated,  // matches and the text between them become words of their own
  kRemoved,   // matches are dropped, the text between them stays
};

struct SplitStep {
  Regex pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // swap the roles of matches and the text between them
};

struct ByteLevelStep {
  bool add_prefix_space = false;  // put " " before every piece that does not start with one
  bool use_regex = true;          // split with kGpt2SplitPattern
};

class PreTokenizer {
 public:
  // gpt2 must be the compiled kGpt2SplitPattern when byte_level.use_regex is set.
  PreTokenizer(std::vector<SplitStep> splits, ByteLevelStep byte_level, std::optional<Regex> gpt2);

  // Splits `text` (valid UTF-8, already normalized) into words and hands each, non-empty, to
  // on_word, in order. A word view lives only during its call.
  Status Split(std::string_view text, const std::function<void(std::string_view)>& on_word) const;

 private:
  Status Apply(size_t step, std::string_view piece,
               const std::function<void(std::string_view)>& on_word) const;

  std::vector<SplitStep> splits_;
  ByteLevelStep byte_level_;
  std::optional<Regex> gpt2_;
};

}  // namespace moeserve::tokenizer
