// The tokenizer of a Hugging Face model folder: tokenizer.json (byte-level BPE, as GPT-2, Qwen2/3
// and Llama 3 use) plus tokenizer_config.json's special tokens. Encode and Decode give exactly
// what Hugging Face's tokenizers library gives for the configurations it accepts:
//
//   added tokens (matched first) -> normalizer -> pre-tokenizer -> BPE -> post-processor
//
//   normalizer      null, NFC, NFD, NFKC, NFKD, or a Sequence of those
//   pre_tokenizer   Split (Regex or String pattern; Isolated or Removed) steps, then ByteLevel,
//                   alone or in a Sequence
//   model           BPE over the byte-level alphabet (no dropout, byte_fallback, subword prefix
//                   or suffix); merges as "a b" strings or [a, b] pairs; ignore_merges; unk_token
//   post_processor  null, ByteLevel, TemplateProcessing (single sequences), Sequence of those
//   decoder         ByteLevel
//
// Anything else is refused at load with an error naming it. `truncation` and `padding` are
// ignored: the engine decides prompt lengths itself. Added tokens get the ids Hugging Face gives
// them, which for consistent files are the declared ones (a warning is logged otherwise).
// tokenizer_test.cc checks the Qwen3 goldens; hf_compat/ compares with Hugging Face's library on
// random texts over many configurations.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_vocabulary.h"

namespace moeserve::tokenizer {

struct TokenizerOptions {
  // Words whose BPE result is cached (0: no cache). Each costs ~100 bytes.
  size_t word_cache_capacity = 1 << 16;
};

// A token tokenizer_config.json names (eos_token, ...), with its id.
struct NamedToken {
  std::string content;
  int32_t id = 0;
};

class Tokenizer {
 public:
  // Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json.
  static Result<std::unique_ptr<Tokenizer>> LoadFromDir(const std::string& dir,
                                                        const TokenizerOptions& options = {});
  // From file contents; an empty tokenizer_config_json means there is none.
  static Result<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                     std::string_view tokenizer_config_json = {},
                                                     const TokenizerOptions& options = {});
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids. add_special_tokens applies the post-processor's template (Llama 3's BOS; Qwen adds
  // nothing). Fails when `text` is not valid UTF-8. Thread-safe.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = false) const;

  // Ids -> text: the tokens' bytes joined, ill-formed UTF-8 replaced by U+FFFD (as Hugging Face's
  // ByteLevel decoder does). Ids no token has are skipped, as Hugging Face skips them. Thread-safe.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes token `id` decodes to on its own (which may be part of a UTF-8 character); nullopt
  // when no token has the id.
  std::optional<std::string_view> TokenBytes(int32_t id) const;
  // Whether `id` is an added token marked special (what skip_special_tokens skips).
  bool IsSpecial(int32_t id) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token as the vocabulary spells it (byte-level alphabet), or an added token's content
  // (normalized, for tokens with normalized = true, as Hugging Face gives it).
  std::optional<std::string_view> IdToToken(int32_t id) const;
  // Number of tokens: the BPE vocabulary plus the added tokens outside it.
  size_t vocab_size() const;
  // One past the largest id.
  int32_t id_limit() const;
  const std::vector<AddedToken>& added_tokens() const;
  // The most bytes of input text one token stands for: the longest token's bytes, times 4 when a
  // Unicode normalizer runs first (composing shrinks text: NFC makes 9 bytes of Hangul jamo 3).
  // With a byte-level BPE, whose tokens cover every byte, a text of more than n times this many
  // bytes encodes to more than n tokens: the server refuses such a prompt without encoding it.
  size_t max_bytes_per_token() const;

  // From tokenizer_config.json (nullopt when absent or null).
  const std::optional<NamedToken>& bos_token() const;
  const std::optional<NamedToken>& eos_token() const;
  const std::optional<NamedToken>& pad_token() const;
  const std::optional<NamedToken>& unk_token() const;
  const std::vector<std::string>& additional_special_tokens() const;

  // Empties the BPE word cache (benchmarks of the uncached path). Thread-safe.
  void ClearWordCache() const;

  // The loaded parts (tokenizer_impl.h, private to tokenizer/; public only so the loader's helper
  // functions can fill it in).
  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::tokenizer
